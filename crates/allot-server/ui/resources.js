// The resource text form (`cpu=4,mem=16GiB`) as allot-core reads it (`Resources: FromStr`, the
// reference): `testdata/resources.json` holds the cases both, and the Python client, are tested
// against. Quantities are whole milli-units, computed exactly (BigInt) and answered as numbers.

const MILLI = 1000n;
const MAX_MILLI = 2n ** 64n - 1n;
const SCALES = { k: 10n ** 3n, K: 10n ** 3n, M: 10n ** 6n, G: 10n ** 9n, T: 10n ** 12n, P: 10n ** 15n, Ki: 2n ** 10n, Mi: 2n ** 20n, Gi: 2n ** 30n, Ti: 2n ** 40n, Pi: 2n ** 50n };
/** Milli-units per one of each unit: `m`, none or `B`, and each scale with or without `B`. */
const UNITS = { "": MILLI, B: MILLI, m: 1n };
for (const [unit, scale] of Object.entries(SCALES)) UNITS[unit] = UNITS[`${unit}B`] = scale * MILLI;

/** A resource list allot refuses; `kind` names why as allot-core's `ResourcesError` does. */
export class ResourcesError extends Error {
  constructor(kind, message) {
    super(message);
    this.kind = kind;
  }
}

const trim = (text) => text.replace(/^ +| +$/g, "");

/** `cpu=4,mem=16GiB` as milli-units per name ({cpu: 4000, mem: 17179869184000}); names at 0 left out. */
export function parseResources(text) {
  const milli = new Map();
  if (trim(text) === "") return {};
  for (const raw of text.split(",")) {
    const item = trim(raw);
    if (item === "") throw new ResourcesError("EmptyItem", `empty item in resource list \`${text}\``);
    const equals = item.indexOf("=");
    if (equals < 0) throw new ResourcesError("MissingEquals", `expected name=quantity, got \`${item}\``);
    const name = checkName(trim(item.slice(0, equals)));
    const quantity = parseQuantity(name, trim(item.slice(equals + 1)));
    // Zeros count too: they are left out only at the end.
    if (milli.has(name)) throw new ResourcesError("Duplicate", `resource \`${name}\` is given twice`);
    milli.set(name, quantity);
  }
  return Object.fromEntries([...milli].filter(([, m]) => m > 0n).map(([n, m]) => [n, Number(m)]));
}

function checkName(name) {
  if (name === "") throw new ResourcesError("EmptyName", "resource name must not be empty");
  if (new TextEncoder().encode(name).length > 64) throw new ResourcesError("NameTooLong", `resource name \`${name}\` is longer than 64 bytes`);
  if (!/^[a-z]/.test(name)) throw new ResourcesError("NameStart", `resource name \`${name}\` must start with a lowercase letter a-z`);
  const bad = /[^a-z0-9_.-]/.exec(name);
  if (bad) throw new ResourcesError("NameCharacter", `resource name \`${name}\` contains \`${bad[0]}\``);
  return name;
}

function parseQuantity(name, quantity) {
  const refuse = (kind, why) => new ResourcesError(kind, `resource quantity \`${quantity}\` for \`${name}\` ${why}`);
  if (quantity === "") throw new ResourcesError("EmptyQuantity", `resource \`${name}\` has no quantity`);
  if (quantity.startsWith("-")) throw refuse("Negative", "is negative");
  const whole = /^[0-9]*/.exec(quantity)[0];
  let rest = quantity.slice(whole.length);
  let fraction = "";
  if (rest.startsWith(".")) {
    fraction = /^[0-9]*/.exec(rest.slice(1))[0];
    if (fraction === "") throw refuse("NotANumber", "is not a number");
    rest = rest.slice(1 + fraction.length);
  }
  if (whole === "") throw refuse("NotANumber", "is not a number");
  const unit = rest.replace(/^ +/, "");
  if (!Object.hasOwn(UNITS, unit)) throw refuse("UnknownUnit", `has an unknown unit \`${unit}\``);
  if (fraction.length > 3) throw refuse("TooManyFractionalDigits", "has more than 3 fractional digits");
  const scaled = BigInt(whole + fraction) * UNITS[unit];
  const denominator = 10n ** BigInt(fraction.length);
  if (scaled % denominator !== 0n) throw refuse("Inexact", "is not a whole number of thousandths");
  if (scaled / denominator > MAX_MILLI) throw refuse("TooLarge", "is too large");
  return scaled / denominator;
}
