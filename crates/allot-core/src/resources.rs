//! Resource vectors: named non-negative quantities such as `cpu=4,mem=16GiB,gpu=1`.
//!
//! [`Resources`] is the one resource-vector type of allot. Quantities are whole numbers of
//! milli-units ([`MILLI`] per unit), so `cpu=0.5` is 500 and `mem=1KiB` (1024 bytes) is 1_024_000.
//! Arithmetic is exact and never panics. Only the builders for code and tests panic:
//! [`Resources::with`] and [`Resources::with_milli`] on a bad name, [`SizeWeights::with`] and
//! [`SizeWeights::with_default_divisor`] on a bad name or divisor.
//!
//! The text form is `name=quantity` pairs joined by `,`; see [`Resources`]'s `FromStr` and
//! `Display` impls for the grammar. `r.to_string().parse::<Resources>()` always gives back `r`.
//!
//! At length, as one thing: the type, its exact arithmetic and its one text grammar (parsed,
//! printed, and given as a pattern to the API's document) hold each other's invariants; a third of
//! the file is their tests.

use std::borrow::Borrow;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use smallvec::SmallVec;

/// Milli-units per unit: every quantity is stored as a whole number of thousandths.
pub const MILLI: u64 = 1000;
/// The longest resource name in bytes.
pub const MAX_RESOURCE_NAME_BYTES: usize = 64;

/// CPU cores.
pub const CPU: &str = "cpu";
/// Memory, in bytes.
pub const MEM: &str = "mem";
/// Disk space, in bytes.
pub const DISK: &str = "disk";
/// GPUs.
pub const GPU: &str = "gpu";

/// Names whose quantities are bytes: displayed with byte units (`16GiB`, `500GB`) when exact.
const BYTE_NAMES: [&str; 3] = [MEM, "memory", DISK];

const QUANTITY_HINT: &str = "use a number with an optional unit such as 500m, 4, 16GiB or 500GB";

/// Why a resource name, quantity or list was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResourcesError {
    #[error("resource name must not be empty")]
    EmptyName,
    #[error("resource name `{name}` is {len} bytes long; the limit is {MAX_RESOURCE_NAME_BYTES}")]
    NameTooLong { name: String, len: usize },
    #[error("resource name `{name}` must start with a lowercase letter a-z")]
    NameStart { name: String },
    #[error("resource name `{name}` contains `{found}`; use lowercase letters a-z, digits 0-9, `_`, `-` and `.`")]
    NameCharacter { name: String, found: char },
    #[error("empty item in resource list `{text}`: items are name=quantity joined by `,`; remove the extra `,`")]
    EmptyItem { text: String },
    #[error("expected name=quantity, got `{item}`")]
    MissingEquals { item: String },
    #[error("resource `{name}` is given twice")]
    Duplicate { name: String },
    #[error("resource `{name}` has no quantity; {QUANTITY_HINT}")]
    EmptyQuantity { name: String },
    #[error("resource quantity `{quantity}` for `{name}` is negative; quantities are zero or more")]
    Negative { name: String, quantity: String },
    #[error("resource quantity `{quantity}` for `{name}` is not a number; {QUANTITY_HINT}")]
    NotANumber { name: String, quantity: String },
    #[error("resource quantity `{quantity}` for `{name}` has an unknown unit `{unit}`; {QUANTITY_HINT}")]
    UnknownUnit { name: String, quantity: String, unit: String },
    #[error(
        "resource quantity `{quantity}` for `{name}` has more than 3 fractional digits; the finest step is 0.001 (1m)"
    )]
    TooManyFractionalDigits { name: String, quantity: String },
    #[error("resource quantity `{quantity}` for `{name}` is not a whole number of thousandths; the finest step is 0.001 (1m)")]
    Inexact { name: String, quantity: String },
    #[error("resource quantity `{quantity}` for `{name}` is too large; the limit is 18446744073709551.615 units")]
    TooLarge { name: String, quantity: String },
    #[error("resource quantity `{quantity}` for `{name}` is too large: in its unit, at most {digits} digits before the point")]
    TooManyDigits { name: String, quantity: String, digits: u32 },
}

/// The name of a resource, e.g. `cpu` or `nvidia.com-a100`.
///
/// Invariant: 1 to [`MAX_RESOURCE_NAME_BYTES`] bytes of ASCII lowercase letters, digits, `_`, `-`
/// and `.`, starting with a letter.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ResourceName(Arc<str>);

impl ResourceName {
    pub fn new(name: &str) -> Result<ResourceName, ResourcesError> {
        let first = name.chars().next().ok_or(ResourcesError::EmptyName)?;
        if name.len() > MAX_RESOURCE_NAME_BYTES {
            return Err(ResourcesError::NameTooLong { name: name.to_owned(), len: name.len() });
        }
        if !first.is_ascii_lowercase() {
            return Err(ResourcesError::NameStart { name: name.to_owned() });
        }
        let allowed = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '_' | '-' | '.');
        if let Some(found) = name.chars().find(|&c| !allowed(c)) {
            return Err(ResourcesError::NameCharacter { name: name.to_owned(), found });
        }
        Ok(ResourceName(Arc::from(name)))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

// Lets maps keyed by `ResourceName` be searched with a `&str`; `Eq`, `Ord` and `Hash` agree with `str`'s.
impl Borrow<str> for ResourceName {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ResourceName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Named non-negative quantities in milli-units, e.g. `cpu=4,mem=16GiB,gpu=1`.
///
/// Invariant: the names are sorted and distinct, and zero is never stored; a missing name means
/// 0. So two values are equal (and hash alike) exactly when every resource has the same
/// quantity. Kept inline for up to [`INLINE_RESOURCES`] names (most vectors name a few), so a
/// copy allocates nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Resources(SmallVec<[(ResourceName, u64); INLINE_RESOURCES]>);

/// How many names a [`Resources`] holds without an allocation of its own.
pub const INLINE_RESOURCES: usize = 2;

impl Resources {
    pub fn new() -> Resources {
        Resources::default()
    }

    /// Sets `name` to `units` whole units (stored as `units * MILLI`, saturating).
    ///
    /// A builder for code and tests. Panics if `name` is not a valid [`ResourceName`].
    pub fn with(self, name: &str, units: u64) -> Resources {
        self.with_milli(name, units.saturating_mul(MILLI))
    }

    /// Sets `name` to `milli` milli-units.
    ///
    /// A builder for code and tests. Panics if `name` is not a valid [`ResourceName`].
    pub fn with_milli(mut self, name: &str, milli: u64) -> Resources {
        let name = ResourceName::new(name).unwrap_or_else(|e| panic!("Resources::with: {e}"));
        self.set_milli(name, milli);
        self
    }

    fn find(&self, name: &str) -> Result<usize, usize> {
        self.0.binary_search_by(|(have, _)| have.as_str().cmp(name))
    }

    /// The quantity of `name` in milli-units; 0 if absent.
    pub fn get_milli(&self, name: &str) -> u64 {
        match self.find(name) {
            Ok(i) => self.0[i].1,
            Err(_) => 0,
        }
    }

    /// Sets `name` to `milli` milli-units; 0 removes it.
    pub fn set_milli(&mut self, name: ResourceName, milli: u64) {
        match (self.find(name.as_str()), milli) {
            (Ok(i), 0) => {
                self.0.remove(i);
            }
            (Ok(i), _) => self.0[i].1 = milli,
            (Err(_), 0) => {}
            (Err(i), _) => self.0.insert(i, (name, milli)),
        }
    }

    /// True when every quantity is 0.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The non-zero quantities in milli-units, in name order.
    pub fn iter(&self) -> impl Iterator<Item = (&ResourceName, u64)> {
        self.0.iter().map(|(name, milli)| (name, *milli))
    }

    /// Merges two sorted vectors name by name: `both` for a name on both sides (`None`: the
    /// whole merge fails), `left` and `right` for a name on one side only; zeros are dropped.
    fn merge(
        &self,
        other: &Resources,
        left: impl Fn(u64) -> u64,
        right: impl Fn(u64) -> u64,
        both: impl Fn(u64, u64) -> Option<u64>,
    ) -> Option<Resources> {
        let (a, b) = (&self.0, &other.0);
        let mut out = SmallVec::with_capacity(a.len().max(b.len()));
        let (mut i, mut j) = (0, 0);
        loop {
            let (name, milli) = match (a.get(i), b.get(j)) {
                (None, None) => break,
                (Some((na, ma)), Some((nb, mb))) if na == nb => {
                    (i, j) = (i + 1, j + 1);
                    (na, both(*ma, *mb)?)
                }
                (Some((na, ma)), Some((nb, _))) if na < nb => {
                    i += 1;
                    (na, left(*ma))
                }
                (Some((na, ma)), None) => {
                    i += 1;
                    (na, left(*ma))
                }
                (_, Some((nb, mb))) => {
                    j += 1;
                    (nb, right(*mb))
                }
            };
            if milli > 0 {
                out.push((name.clone(), milli));
            }
        }
        Some(Resources(out))
    }

    /// The per-name sum; `None` if any quantity overflows `u64` milli-units.
    pub fn checked_add(&self, other: &Resources) -> Option<Resources> {
        if other.0.is_empty() {
            return Some(self.clone());
        }
        self.merge(other, |m| m, |m| m, u64::checked_add)
    }

    /// The per-name sum, each quantity at most `u64::MAX` milli-units.
    pub fn saturating_add(&self, other: &Resources) -> Resources {
        self.merge(other, |m| m, |m| m, |a, b| Some(a.saturating_add(b))).unwrap_or_default()
    }

    /// The per-name difference, floored at 0.
    pub fn saturating_sub(&self, other: &Resources) -> Resources {
        self.merge(other, |m| m, |_| 0, |a, b| Some(a.saturating_sub(b))).unwrap_or_default()
    }

    /// True when `self` has at least as much of every resource as `want` asks for.
    ///
    /// Resources `want` does not name are not checked, so an empty `want` always fits.
    pub fn fits(&self, want: &Resources) -> bool {
        want.0.iter().all(|(name, milli)| self.get_milli(name.as_str()) >= *milli)
    }

    /// The per-name minimum over both sides' names, a missing name counting as 0.
    ///
    /// Symmetric: `a.min(&b) == b.min(&a)`, so `{gpu:1}.min({})` is `{}`. This differs from
    /// Reflow's `Resources.Min`, which was asymmetric.
    pub fn min(&self, other: &Resources) -> Resources {
        self.merge(other, |_| 0, |_| 0, |a, b| Some(a.min(b))).unwrap_or_default()
    }

    /// The per-name maximum over both sides' names.
    pub fn max(&self, other: &Resources) -> Resources {
        self.merge(other, |m| m, |m| m, |a, b| Some(a.max(b))).unwrap_or_default()
    }

    /// A scalar size for best-fit ordering that counts every resource: the sum over names of
    /// the quantity in units divided by that name's divisor in `weights`.
    pub fn size(&self, weights: &SizeWeights) -> f64 {
        self.0.iter().map(|(name, milli)| units_f64(*milli) / weights.divisor(name.as_str())).sum()
    }

    /// The weighted distance between two vectors: the sum over both sides' names of the absolute
    /// difference in units divided by that name's divisor (Reflow's `ScaledDistance`, for every name).
    pub fn distance(&self, other: &Resources, weights: &SizeWeights) -> f64 {
        let names: BTreeSet<&ResourceName> = self.0.iter().chain(other.0.iter()).map(|(name, _)| name).collect();
        names
            .into_iter()
            .map(|name| {
                let diff = self.get_milli(name.as_str()).abs_diff(other.get_milli(name.as_str()));
                units_f64(diff) / weights.divisor(name.as_str())
            })
            .sum()
    }
}

fn units_f64(milli: u64) -> f64 {
    milli as f64 / MILLI as f64
}

/// How many units of each resource count as one unit of [`Resources::size`].
///
/// Invariant: every divisor, including the default for unlisted names, is finite and above 0.
#[derive(Debug, Clone, PartialEq)]
pub struct SizeWeights {
    divisors: BTreeMap<ResourceName, f64>,
    default_divisor: f64,
}

impl Default for SizeWeights {
    /// `cpu` 1, `mem` and `memory` 8 GiB (8 GiB counts like one cpu, as in Reflow), `disk` 256 GiB,
    /// `gpu` 0.125 (one gpu counts like 8 cpu), and 1 for any other name.
    fn default() -> SizeWeights {
        const GIB: f64 = (1u64 << 30) as f64;
        SizeWeights { divisors: BTreeMap::new(), default_divisor: 1.0 }
            .with(CPU, 1.0)
            .with(MEM, 8.0 * GIB)
            .with("memory", 8.0 * GIB)
            .with(DISK, 256.0 * GIB)
            .with(GPU, 0.125)
    }
}

impl SizeWeights {
    /// Counts `divisor` units of `name` as one unit of size.
    ///
    /// Panics if `name` is not a valid [`ResourceName`] or `divisor` is not finite and above 0.
    pub fn with(mut self, name: &str, divisor: f64) -> SizeWeights {
        let name = ResourceName::new(name).unwrap_or_else(|e| panic!("SizeWeights::with: {e}"));
        check_divisor(divisor);
        self.divisors.insert(name, divisor);
        self
    }

    /// Counts `divisor` units of any name not listed as one unit of size.
    ///
    /// Panics if `divisor` is not finite and above 0.
    pub fn with_default_divisor(mut self, divisor: f64) -> SizeWeights {
        check_divisor(divisor);
        self.default_divisor = divisor;
        self
    }

    /// The divisor for `name`: its own if listed, else the default.
    pub fn divisor(&self, name: &str) -> f64 {
        self.divisors.get(name).copied().unwrap_or(self.default_divisor)
    }
}

fn check_divisor(divisor: f64) {
    assert!(divisor.is_finite() && divisor > 0.0, "size divisor must be finite and above 0, got {divisor}");
}

/// Parses `name=quantity` pairs joined by `,`, e.g. `cpu=4, mem=16GiB, gpu=1`.
///
/// Spaces around items, names and quantities (and between a number and its unit) are ignored.
/// An empty or all-whitespace string is empty `Resources`. A name may appear once; a quantity of 0
/// is accepted and not stored.
///
/// A quantity is a decimal number with at most 3 fractional digits (`4`, `0.5`, `1.125`; at least
/// one digit before the `.`), then an optional unit:
/// - `m`: thousandths (`500m` is 0.5);
/// - `k` or `K`, `M`, `G`, `T`, `P`: 10^3 to 10^15, optionally followed by `B` (`500GB`);
/// - `Ki`, `Mi`, `Gi`, `Ti`, `Pi`: 2^10 to 2^50, optionally followed by `B` (`16GiB`, `16Gi`);
/// - `B`: bytes, no scaling.
///
/// The result must be a whole number of milli-units that fits in a `u64`.
impl FromStr for Resources {
    type Err = ResourcesError;

    fn from_str(text: &str) -> Result<Resources, ResourcesError> {
        parse(text, false)
    }
}

impl Resources {
    /// Parses resources given to the API: the text form (but a name given twice counts once, with
    /// its largest quantity), with at most [`max_integer_digits`]
    /// significant digits before the point for the quantity's unit (at most 16 for plain units,
    /// 19 in `m`, 13 in `k`/`Ki`, down to 1 in `P`/`Pi`), so that the API's document can state
    /// the limit as a pattern ([`resources_pattern`]).
    pub fn parse_api(text: &str) -> Result<Resources, ResourcesError> {
        parse(text, true)
    }
}

/// Spaces the text form ignores (only ASCII spaces: the API's document states them in a pattern).
fn trim(text: &str) -> &str {
    text.trim_matches(' ')
}

fn parse(text: &str, bounded: bool) -> Result<Resources, ResourcesError> {
    let mut resources = Resources::new();
    if trim(text).is_empty() {
        return Ok(resources);
    }
    let mut seen = BTreeSet::new();
    for item in text.split(',') {
        let item = trim(item);
        if item.is_empty() {
            return Err(ResourcesError::EmptyItem { text: text.to_owned() });
        }
        let (name, quantity) =
            item.split_once('=').ok_or_else(|| ResourcesError::MissingEquals { item: item.to_owned() })?;
        let name = ResourceName::new(trim(name))?;
        let milli = parse_quantity(name.as_str(), trim(quantity), bounded)?;
        // People type the text form (flags, configuration): a name given twice is a mistake. The
        // API's document states the form as a regular expression, which cannot refuse a repeated
        // name; there the largest quantity counts, so what the pattern says of quantities above
        // zero stays true.
        if !seen.insert(name.clone()) {
            if !bounded {
                return Err(ResourcesError::Duplicate { name: name.as_str().to_owned() });
            }
            let largest = milli.max(resources.get_milli(name.as_str()));
            resources.set_milli(name, largest);
            continue;
        }
        resources.set_milli(name, milli);
    }
    Ok(resources)
}

/// The most significant digits before the point that a quantity given to the API may have in a
/// unit of `scale` milli-units: the largest `n` with `10^n * scale <= u64::MAX`, so that any such
/// quantity (with up to 3 fractional digits) fits.
pub fn max_integer_digits(scale: u64) -> u32 {
    (u64::MAX / scale).ilog10()
}

/// Every unit a quantity may have, with its scale in milli-units.
const UNITS: [&str; 25] = [
    "m", "", "B", "k", "K", "kB", "KB", "Ki", "KiB", "M", "MB", "Mi", "MiB", "G", "GB", "Gi", "GiB", "T", "TB", "Ti",
    "TiB", "P", "PB", "Pi", "PiB",
];

/// The text form that [`Resources::parse_api`] accepts, as a regular expression (no look-around),
/// but for one rule it cannot state: a name may appear once. With `nonzero`, at least one
/// quantity must be above zero (an empty list, or only zeros, does not match).
pub fn resources_pattern(nonzero: bool) -> String {
    let name = "[a-z][a-z0-9_.-]{0,63}";
    // Quantities grouped by their digit limit; `m` takes no fraction but zeros (it would be inexact).
    let mut groups: BTreeMap<u32, Vec<&str>> = BTreeMap::new();
    for (unit, scale) in UNITS.iter().filter(|u| **u != "m").filter_map(|u| Some((u, unit_milli(u)?))) {
        groups.entry(max_integer_digits(scale)).or_default().push(unit);
    }
    let quantity = |nonzero: bool| {
        let frac_nonzero = r"(?:[1-9][0-9]{0,2}|0[1-9][0-9]?|00[1-9])";
        let number = |n: u32| {
            if nonzero {
                format!(r"0*(?:[1-9][0-9]{{0,{}}}(?:\.[0-9]{{1,3}})?|0\.{frac_nonzero})", n - 1)
            } else {
                format!(r"0*[0-9]{{1,{n}}}(?:\.[0-9]{{1,3}})?")
            }
        };
        let mut alternatives: Vec<String> = groups
            .iter()
            .map(|(n, units)| {
                let units: Vec<String> = units.iter().map(|u| u.to_string()).collect();
                format!("{} *(?:{})", number(*n), units.join("|"))
            })
            .collect();
        let m_digits = max_integer_digits(1);
        alternatives.push(if nonzero {
            format!(r"0*[1-9][0-9]{{0,{}}}(?:\.0{{1,3}})? *m", m_digits - 1)
        } else {
            format!(r"0*[0-9]{{1,{m_digits}}}(?:\.0{{1,3}})? *m")
        });
        format!("(?:{})", alternatives.join("|"))
    };
    let item = |nonzero: bool| format!(" *{name} *= *{} *", quantity(nonzero));
    if nonzero {
        let any = item(false);
        format!("^(?:{any},)*{}(?:,{any})*$", item(true))
    } else {
        let any = item(false);
        format!("^(?:{any}(?:,{any})*| *)$")
    }
}

/// Parses one quantity (already trimmed) for resource `name` into milli-units.
fn parse_quantity(name: &str, quantity: &str, bounded: bool) -> Result<u64, ResourcesError> {
    let owned = || (name.to_owned(), quantity.to_owned());
    if quantity.is_empty() {
        return Err(ResourcesError::EmptyQuantity { name: name.to_owned() });
    }
    if quantity.starts_with('-') {
        let (name, quantity) = owned();
        return Err(ResourcesError::Negative { name, quantity });
    }
    let int_len = quantity.bytes().take_while(u8::is_ascii_digit).count();
    let (int_digits, rest) = quantity.split_at(int_len);
    let (frac_digits, rest) = match rest.strip_prefix('.') {
        Some(after) => {
            let frac_len = after.bytes().take_while(u8::is_ascii_digit).count();
            if frac_len == 0 {
                let (name, quantity) = owned();
                return Err(ResourcesError::NotANumber { name, quantity });
            }
            after.split_at(frac_len)
        }
        None => ("", rest),
    };
    if int_digits.is_empty() {
        let (name, quantity) = owned();
        return Err(ResourcesError::NotANumber { name, quantity });
    }
    let unit = rest.trim_start_matches(' ');
    let Some(scale) = unit_milli(unit) else {
        let (name, quantity) = owned();
        return Err(ResourcesError::UnknownUnit { name, quantity, unit: unit.to_owned() });
    };
    let significant = int_digits.trim_start_matches('0').len();
    if bounded && significant > max_integer_digits(scale) as usize {
        let (name, quantity) = owned();
        return Err(ResourcesError::TooManyDigits { name, quantity, digits: max_integer_digits(scale) });
    }
    if frac_digits.len() > 3 {
        let (name, quantity) = owned();
        return Err(ResourcesError::TooManyFractionalDigits { name, quantity });
    }
    let too_large = || {
        let (name, quantity) = owned();
        ResourcesError::TooLarge { name, quantity }
    };
    // The number as a whole count of 10^-frac_len: `1.25` is 125 hundredths.
    let mut mantissa: u128 = 0;
    for digit in int_digits.bytes().chain(frac_digits.bytes()) {
        mantissa =
            mantissa.checked_mul(10).and_then(|m| m.checked_add(u128::from(digit - b'0'))).ok_or_else(too_large)?;
    }
    let denominator = 10u128.pow(frac_digits.len() as u32);
    // An overflow here means the value is at least 2^128 / 1000 milli-units, far above u64::MAX.
    let scaled = mantissa.checked_mul(u128::from(scale)).ok_or_else(too_large)?;
    if scaled % denominator != 0 {
        let (name, quantity) = owned();
        return Err(ResourcesError::Inexact { name, quantity });
    }
    u64::try_from(scaled / denominator).map_err(|_| too_large())
}

/// Milli-units per one of `unit`, or `None` if the unit is unknown.
fn unit_milli(unit: &str) -> Option<u64> {
    let unit = match unit {
        "" | "B" => return Some(MILLI),
        "m" => return Some(1),
        _ => unit.strip_suffix('B').unwrap_or(unit),
    };
    let units: u64 = match unit {
        "k" | "K" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        "T" => 1_000_000_000_000,
        "P" => 1_000_000_000_000_000,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        "Pi" => 1 << 50,
        _ => return None,
    };
    Some(units * MILLI)
}

/// Writes `name=quantity` pairs in name order, joined by `,`; empty `Resources` is the empty string.
///
/// A quantity is the number of units with up to 3 fractional digits and no trailing zeros
/// (`cpu=0.5`, `gpu=1`, `x=0.001`). For byte names (`mem`, `memory`, `disk`) holding a whole
/// number of bytes, the quantity is written as the shortest of: plain bytes, and the value in each
/// unit `PiB`..`KiB`, `PB`..`kB` in which it is at least 1 and exact to 3 fractional digits. Ties
/// prefer binary units, larger units, then plain bytes: `mem=16GiB`, `disk=500GB`, `mem=1KiB`,
/// `mem=1.5MiB`, `mem=1536` (not `1.5KiB`), `mem=1kB`. Parsing the output gives back the same value.
impl fmt::Display for Resources {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (name, milli)) in self.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{name}=")?;
            if BYTE_NAMES.contains(&name.as_str()) {
                f.write_str(&bytes_text(milli))?;
            } else {
                f.write_str(&decimal(milli))?;
            }
        }
        Ok(())
    }
}

impl Resources {
    /// The quantities as people read them in tables and messages: `mem=22.4GiB` for
    /// 24,051,816,857 bytes. Byte quantities that the text form already writes with a unit and at
    /// most one fractional digit stay as they are (`mem=16GiB`, `disk=500GB`); other byte
    /// quantities are rounded to one fractional digit of the largest binary unit they fill
    /// (`1.5KiB`, `512B`). Other quantities are written exactly. Lossy: it does not parse back to
    /// the same value; the text form (`Display`) does.
    pub fn human(&self) -> HumanResources<'_> {
        HumanResources(self)
    }
}

/// [`Resources::human`]: displays the quantities rounded for people.
#[derive(Debug, Clone, Copy)]
pub struct HumanResources<'a>(&'a Resources);

impl fmt::Display for HumanResources<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (name, milli)) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{name}=")?;
            if BYTE_NAMES.contains(&name.as_str()) {
                f.write_str(&human_bytes(milli))?;
            } else {
                f.write_str(&decimal(milli))?;
            }
        }
        Ok(())
    }
}

/// A byte quantity for people: the exact text when it has a unit and at most one fractional
/// digit, else one fractional digit of the largest binary unit it fills (or whole bytes).
fn human_bytes(milli: u64) -> String {
    const UNITS: [(&str, u64); 5] =
        [("KiB", 1 << 10), ("MiB", 1 << 20), ("GiB", 1 << 30), ("TiB", 1 << 40), ("PiB", 1 << 50)];
    let exact = bytes_text(milli);
    let number = exact.trim_end_matches(|c: char| c.is_ascii_alphabetic());
    let fraction_digits = number.split_once('.').map_or(0, |(_, fraction)| fraction.len());
    if number.len() < exact.len() && fraction_digits <= 1 {
        return exact;
    }
    let bytes = u128::from(milli) / u128::from(MILLI);
    let Some(mut unit) = UNITS.iter().rposition(|&(_, size)| bytes >= u128::from(size)) else {
        return format!("{}B", decimal(milli));
    };
    // Tenths of the unit, rounded to nearest; 1023.96KiB rounds up into the next unit.
    let tenths = |unit: usize| (bytes * 10 + u128::from(UNITS[unit].1) / 2) / u128::from(UNITS[unit].1);
    if tenths(unit) >= 10 * 1024 && unit + 1 < UNITS.len() {
        unit += 1;
    }
    let tenths = tenths(unit);
    let (whole, tenth) = (tenths / 10, tenths % 10);
    let suffix = UNITS[unit].0;
    if tenth == 0 {
        format!("{whole}{suffix}")
    } else {
        format!("{whole}.{tenth}{suffix}")
    }
}

/// `thousandths / 1000` with up to 3 fractional digits and no trailing zeros.
fn decimal(thousandths: u64) -> String {
    let whole = thousandths / MILLI;
    let frac = thousandths % MILLI;
    if frac == 0 {
        return whole.to_string();
    }
    let digits = format!("{frac:03}");
    format!("{whole}.{}", digits.trim_end_matches('0'))
}

/// A byte count as text: the shortest of plain bytes and every unit in which it is at least 1 and
/// exact to 3 fractional digits; ties go to the earlier unit in `UNITS`, then to plain bytes.
fn bytes_text(milli: u64) -> String {
    const UNITS: [(&str, u64); 10] = [
        ("PiB", 1 << 50),
        ("TiB", 1 << 40),
        ("GiB", 1 << 30),
        ("MiB", 1 << 20),
        ("KiB", 1 << 10),
        ("PB", 1_000_000_000_000_000),
        ("TB", 1_000_000_000_000),
        ("GB", 1_000_000_000),
        ("MB", 1_000_000),
        ("kB", 1_000),
    ];
    let plain = decimal(milli);
    let fraction_of_byte = milli % MILLI;
    if fraction_of_byte != 0 {
        return plain;
    }
    let bytes = milli / MILLI;
    let mut best: Option<String> = None;
    for (suffix, size) in UNITS {
        // `milli` is the value in thousandths of a byte, so `milli / size` is thousandths of the unit.
        let (thousandths, rest) = (milli / size, milli % size);
        if bytes < size || rest != 0 {
            continue;
        }
        let text = format!("{}{suffix}", decimal(thousandths));
        let shorter = match &best {
            Some(b) => text.len() < b.len(),
            None => true,
        };
        if shorter {
            best = Some(text);
        }
    }
    match best {
        Some(text) if text.len() <= plain.len() => text,
        _ => plain,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const GIB: u64 = 1 << 30;

    proptest::proptest! {
        /// The API's patterns accept exactly what `parse_api` accepts, but for repeated names.
        #[test]
        fn patterns_agree_with_the_parser(
            parts in proptest::collection::vec(
                proptest::sample::select(vec![
                    "cpu", "mem", "=", ",", " ", "1", "0", ".", "5", "m", "Ki", "B", "G", "P", "iB",
                    "9999999999999", "99", "00", "-", "X", "\t",
                ]),
                0..9,
            )
        ) {
            let text = parts.concat();
            let any = regex::Regex::new(&resources_pattern(false)).unwrap();
            let nonzero = regex::Regex::new(&resources_pattern(true)).unwrap();
            let parsed = Resources::parse_api(&text);
            proptest::prop_assert_eq!(parsed.is_ok(), any.is_match(&text), "{:?}: {:?}", text, parsed);
            let some = parsed.as_ref().is_ok_and(|r| !r.is_empty());
            proptest::prop_assert_eq!(some, nonzero.is_match(&text), "{:?} (nonzero): {:?}", text, parsed);
        }
    }

    #[test]
    fn the_api_bounds_digits_by_unit() {
        assert_eq!(max_integer_digits(1), 19);
        assert_eq!(max_integer_digits(MILLI), 16);
        assert_eq!(max_integer_digits((1 << 50) * MILLI), 1);
        assert!(Resources::parse_api("cpu=9999999999999999.999").is_ok());
        assert!(matches!(
            Resources::parse_api("cpu=10000000000000000"),
            Err(ResourcesError::TooManyDigits { digits: 16, .. })
        ));
        assert!(Resources::parse_api("mem=0009PiB").is_ok());
        assert!(Resources::parse_api("mem=10PiB").is_err());
        assert!("cpu=18446744073709551.615".parse::<Resources>().is_ok(), "the text form still reads every value");
        assert_eq!(Resources::parse_api("cpu=1,cpu=0"), Ok(Resources::new().with(CPU, 1)), "the largest counts");
        assert!(matches!("cpu=1,cpu=0".parse::<Resources>(), Err(ResourcesError::Duplicate { .. })));
    }

    #[test]
    fn human_display_rounds_bytes_and_keeps_the_text_form_exact() {
        let human = |text: &str| parse(text).unwrap().human().to_string();
        assert_eq!(human("cpu=4,mem=24051816857"), "cpu=4,mem=22.4GiB");
        assert_eq!(human("mem=16GiB,disk=500GB,gpu=1"), "disk=500GB,gpu=1,mem=16GiB");
        assert_eq!(human("mem=1.5MiB"), "mem=1.5MiB");
        assert_eq!(human("mem=1.25GiB"), "mem=1.3GiB");
        assert_eq!(human("mem=1536"), "mem=1.5KiB");
        assert_eq!(human("mem=512"), "mem=512B");
        assert_eq!(human("mem=0.5"), "mem=0.5B");
        assert_eq!(human("mem=1048575"), "mem=1MiB", "1023.999KiB rounds into the next unit");
        assert_eq!(human("disk=18446744073709551"), "disk=16.4PiB");
        assert_eq!(human("cpu=0.125,x=123456789"), "cpu=0.125,x=123456789");
        assert_eq!(human(""), "");
        // The text form is unchanged and still round-trips.
        let local = parse("mem=24051816857").unwrap();
        assert_eq!(local.to_string(), "mem=24051816857");
        assert_eq!(local.to_string().parse::<Resources>().unwrap(), local);
    }

    fn parse(text: &str) -> Result<Resources, ResourcesError> {
        text.parse()
    }

    #[test]
    fn parses_examples() {
        assert_eq!(parse("cpu=4,mem=16GiB,gpu=1"), Ok(Resources::new().with(CPU, 4).with(MEM, 16 * GIB).with(GPU, 1)));
        assert_eq!(parse("cpu=0.5"), Ok(Resources::new().with_milli(CPU, 500)));
        assert_eq!(parse("disk=500GB"), Ok(Resources::new().with(DISK, 500_000_000_000)));
        assert_eq!(parse(" cpu = 4 , mem = 16Gi "), Ok(Resources::new().with(CPU, 4).with(MEM, 16 * GIB)));
        assert_eq!(parse("cpu=500m"), parse("cpu=0.5"));
        assert_eq!(parse("cpu=1.125"), Ok(Resources::new().with_milli(CPU, 1125)));
        assert_eq!(parse("mem=1.5KiB"), Ok(Resources::new().with(MEM, 1536)));
        assert_eq!(parse("mem=16 GiB"), parse("mem=16GiB"));
        assert_eq!(parse("mem=2B"), Ok(Resources::new().with(MEM, 2)));
        assert_eq!(parse("x=1k,y=1KB,z=1M"), Ok(Resources::new().with("x", 1000).with("y", 1000).with("z", 1_000_000)));
        assert_eq!(parse("x=1P,y=1Pi"), Ok(Resources::new().with("x", 10u64.pow(15)).with("y", 1 << 50)));
        assert_eq!(parse("x=1Ti,y=1TB"), Ok(Resources::new().with("x", 1 << 40).with("y", 10u64.pow(12))));
        assert_eq!(parse("x=1Mi,y=1MiB"), Ok(Resources::new().with("x", 1 << 20).with("y", 1 << 20)));
        assert_eq!(parse("x=007"), Ok(Resources::new().with("x", 7)));
        assert_eq!(parse("x=0.001"), Ok(Resources::new().with_milli("x", 1)));
        assert_eq!(parse("x=1.0m"), Ok(Resources::new().with_milli("x", 1)));
        assert_eq!(parse(""), Ok(Resources::new()));
        assert_eq!(parse("   "), Ok(Resources::new()));
        assert!(parse("\t").is_err(), "only spaces are ignored");
        assert_eq!(parse("cpu=0,gpu=0.000"), Ok(Resources::new()));
        assert_eq!(parse("cpu=18446744073709551.615"), Ok(Resources::new().with_milli(CPU, u64::MAX)));
    }

    #[test]
    fn refuses_bad_text() {
        let err = |text: &str| parse(text).unwrap_err();
        assert_eq!(
            err("mem=16XB"),
            ResourcesError::UnknownUnit { name: "mem".into(), quantity: "16XB".into(), unit: "XB".into() }
        );
        assert_eq!(
            err("mem=16XB").to_string(),
            "resource quantity `16XB` for `mem` has an unknown unit `XB`; \
             use a number with an optional unit such as 500m, 4, 16GiB or 500GB"
        );
        assert_eq!(err("cpu=1,cpu=2"), ResourcesError::Duplicate { name: "cpu".into() });
        assert_eq!(err("cpu=1,cpu=2").to_string(), "resource `cpu` is given twice");
        assert_eq!(err("cpu=0, cpu =0"), ResourcesError::Duplicate { name: "cpu".into() });
        assert_eq!(err("cpu"), ResourcesError::MissingEquals { item: "cpu".into() });
        assert_eq!(err("cpu").to_string(), "expected name=quantity, got `cpu`");
        assert!(matches!(err("cpu=1,,mem=2"), ResourcesError::EmptyItem { .. }));
        assert!(matches!(err("cpu=1,"), ResourcesError::EmptyItem { .. }));
        assert_eq!(err("cpu="), ResourcesError::EmptyQuantity { name: "cpu".into() });
        assert_eq!(err("cpu= "), ResourcesError::EmptyQuantity { name: "cpu".into() });
        assert!(matches!(err("cpu=-1"), ResourcesError::Negative { .. }));
        for bad in ["nan", "NaN", "inf", "-inf", "+1", ".5", "4.", "abc", "1..2", "0x10", "1e3", "1,5"] {
            let e = err(&format!("cpu={bad}"));
            assert!(
                matches!(
                    e,
                    ResourcesError::NotANumber { .. }
                        | ResourcesError::Negative { .. }
                        | ResourcesError::UnknownUnit { .. }
                        | ResourcesError::MissingEquals { .. }
                ),
                "{bad}: {e:?}"
            );
        }
        assert!(matches!(err("cpu=nan"), ResourcesError::NotANumber { .. }));
        assert!(matches!(err("cpu=inf"), ResourcesError::NotANumber { .. }));
        assert!(matches!(err("cpu=1e3"), ResourcesError::UnknownUnit { .. }));
        assert!(matches!(err("cpu=1mB"), ResourcesError::UnknownUnit { .. }));
        assert!(matches!(err("cpu=1ki"), ResourcesError::UnknownUnit { .. }));
        assert!(matches!(err("cpu=0.0001"), ResourcesError::TooManyFractionalDigits { .. }));
        assert!(matches!(err("cpu=0.5000"), ResourcesError::TooManyFractionalDigits { .. }));
        assert!(matches!(err("cpu=1.5m"), ResourcesError::Inexact { .. }));
        assert!(matches!(err("cpu=18446744073709551.616"), ResourcesError::TooLarge { .. }));
        assert!(matches!(err("mem=20P"), ResourcesError::TooLarge { .. }));
        assert!(matches!(err(&format!("cpu={}", "9".repeat(80))), ResourcesError::TooLarge { .. }));
        assert!(matches!(err(&format!("cpu={}", "9".repeat(38))), ResourcesError::TooLarge { .. }));
        assert_eq!(err("=1"), ResourcesError::EmptyName);
        assert_eq!(err("CPU=1"), ResourcesError::NameStart { name: "CPU".into() });
        assert_eq!(err("1cpu=1"), ResourcesError::NameStart { name: "1cpu".into() });
        assert_eq!(err("c pu=1"), ResourcesError::NameCharacter { name: "c pu".into(), found: ' ' });
        assert_eq!(err("gpU=1"), ResourcesError::NameCharacter { name: "gpU".into(), found: 'U' });
        assert!(matches!(err(&format!("{}=1", "a".repeat(65))), ResourcesError::NameTooLong { len: 65, .. }));
    }

    #[test]
    fn names_are_validated() {
        assert!(ResourceName::new("cpu").is_ok());
        assert!(ResourceName::new("nvidia.com-a100_80g").is_ok());
        assert!(ResourceName::new(&"a".repeat(64)).is_ok());
        assert_eq!(ResourceName::new(""), Err(ResourcesError::EmptyName));
        assert!(ResourceName::new("é").is_err());
        assert!(ResourceName::new("_x").is_err());
        assert!(ResourceName::new("a/b").is_err());
        assert_eq!(ResourceName::new("gpu").unwrap().as_str(), "gpu");
        assert_eq!(ResourceName::new("gpu").unwrap().to_string(), "gpu");
    }

    #[test]
    #[should_panic(expected = "must start with a lowercase letter")]
    fn with_panics_on_a_bad_name() {
        let _ = Resources::new().with("CPU", 1);
    }

    #[test]
    fn builders_and_accessors() {
        let r = Resources::new().with(CPU, 2).with_milli(GPU, 1500).with("x", 0);
        assert_eq!(r.get_milli(CPU), 2000);
        assert_eq!(r.get_milli(GPU), 1500);
        assert_eq!(r.get_milli("x"), 0);
        assert_eq!(r.get_milli("not a name"), 0);
        assert_eq!(r.iter().map(|(n, m)| (n.as_str(), m)).collect::<Vec<_>>(), [(CPU, 2000), (GPU, 1500)]);
        let mut r = r.with(CPU, 0);
        assert_eq!(r, Resources::new().with_milli(GPU, 1500));
        r.set_milli(ResourceName::new(GPU).unwrap(), 0);
        assert!(r.is_empty());
        assert_eq!(r, Resources::new());
        assert_eq!(Resources::new().with(CPU, u64::MAX).get_milli(CPU), u64::MAX);
    }

    #[test]
    fn arithmetic() {
        let a = Resources::new().with(CPU, 4).with(MEM, 8);
        let b = Resources::new().with(CPU, 1).with(GPU, 2);
        assert_eq!(a.checked_add(&b), Some(Resources::new().with(CPU, 5).with(MEM, 8).with(GPU, 2)));
        let full = Resources::new().with_milli(CPU, u64::MAX);
        assert_eq!(full.checked_add(&Resources::new().with_milli(CPU, 1)), None);
        assert_eq!(full.checked_add(&Resources::new().with_milli(GPU, 1)).map(|r| r.get_milli(GPU)), Some(1));

        assert_eq!(a.saturating_sub(&b), Resources::new().with(CPU, 3).with(MEM, 8));
        assert_eq!(b.saturating_sub(&a), Resources::new().with(GPU, 2));
        assert!(a.saturating_sub(&a).is_empty());

        assert!(a.fits(&Resources::new()));
        assert!(Resources::new().fits(&Resources::new()));
        assert!(a.fits(&Resources::new().with(CPU, 4)));
        assert!(!a.fits(&Resources::new().with(CPU, 5)));
        assert!(!a.fits(&b), "a has no gpu");
        assert!(!Resources::new().fits(&Resources::new().with_milli(GPU, 1)));

        assert_eq!(a.min(&b), Resources::new().with(CPU, 1));
        assert_eq!(a.min(&b), b.min(&a));
        assert_eq!(Resources::new().with(GPU, 1).min(&Resources::new()), Resources::new());
        assert_eq!(Resources::new().min(&Resources::new().with(GPU, 1)), Resources::new());
        assert_eq!(a.max(&b), Resources::new().with(CPU, 4).with(MEM, 8).with(GPU, 2));
        assert_eq!(a.max(&b), b.max(&a));
    }

    #[test]
    fn size_and_distance() {
        let w = SizeWeights::default();
        let one_cpu = Resources::new().with(CPU, 1);
        let eight_gib = Resources::new().with(MEM, 8 * GIB);
        assert_eq!(one_cpu.size(&w), 1.0);
        assert_eq!(eight_gib.size(&w), 1.0);
        assert_eq!(Resources::new().with("memory", 8 * GIB).size(&w), 1.0);
        assert_eq!(Resources::new().with(GPU, 1).size(&w), 8.0);
        assert_eq!(Resources::new().with(DISK, 512 * GIB).size(&w), 2.0);
        assert_eq!(Resources::new().with("custom", 3).size(&w), 3.0);
        assert_eq!(Resources::new().with_milli(CPU, 500).size(&w), 0.5);
        assert_eq!(Resources::new().size(&w), 0.0);
        assert_eq!(one_cpu.checked_add(&eight_gib).unwrap().with(GPU, 1).size(&w), 10.0);

        assert_eq!(one_cpu.distance(&eight_gib, &w), 2.0);
        assert_eq!(one_cpu.distance(&one_cpu, &w), 0.0);
        let a = Resources::new().with(CPU, 4).with(GPU, 1);
        let b = Resources::new().with(CPU, 2).with(DISK, 256 * GIB);
        assert_eq!(a.distance(&b, &w), 2.0 + 8.0 + 1.0);
        assert_eq!(a.distance(&b, &w), b.distance(&a, &w));

        let w = w.with(GPU, 1.0).with_default_divisor(2.0);
        assert_eq!(Resources::new().with(GPU, 1).size(&w), 1.0);
        assert_eq!(Resources::new().with("custom", 3).size(&w), 1.5);
        assert_eq!(w.divisor(CPU), 1.0);
        assert_eq!(w.divisor("custom"), 2.0);
    }

    #[test]
    #[should_panic(expected = "finite and above 0")]
    fn size_weights_refuse_zero() {
        let _ = SizeWeights::default().with(CPU, 0.0);
    }

    #[test]
    #[should_panic(expected = "finite and above 0")]
    fn size_weights_refuse_nan() {
        let _ = SizeWeights::default().with(CPU, f64::NAN);
    }

    #[test]
    fn displays_examples() {
        let show = |r: Resources| r.to_string();
        assert_eq!(show(Resources::new()), "");
        assert_eq!(show(Resources::new().with(GPU, 1).with(CPU, 4).with(MEM, 16 * GIB)), "cpu=4,gpu=1,mem=16GiB");
        assert_eq!(show(Resources::new().with_milli(CPU, 500)), "cpu=0.5");
        assert_eq!(show(Resources::new().with_milli("x", 1)), "x=0.001");
        assert_eq!(show(Resources::new().with_milli("x", 1020)), "x=1.02");
        assert_eq!(show(Resources::new().with(DISK, 500_000_000_000)), "disk=500GB");
        assert_eq!(show(Resources::new().with(DISK, 1_250_000_000)), "disk=1.25GB");
        assert_eq!(show(Resources::new().with(DISK, 1 << 40)), "disk=1TiB");
        assert_eq!(show(Resources::new().with(MEM, 1536)), "mem=1536");
        assert_eq!(show(Resources::new().with(MEM, 1024)), "mem=1KiB");
        assert_eq!(show(Resources::new().with(MEM, 1 << 20)), "mem=1MiB");
        assert_eq!(show(Resources::new().with(MEM, 3 << 19)), "mem=1.5MiB");
        assert_eq!(show(Resources::new().with(MEM, 1000)), "mem=1kB");
        assert_eq!(show(Resources::new().with(MEM, 1001)), "mem=1001");
        assert_eq!(show(Resources::new().with(MEM, 512)), "mem=512");
        assert_eq!(show(Resources::new().with(MEM, GIB / 2)), "mem=512MiB");
        assert_eq!(show(Resources::new().with("memory", 3 * GIB)), "memory=3GiB");
        assert_eq!(show(Resources::new().with_milli(MEM, 1500)), "mem=1.5");
        assert_eq!(show(Resources::new().with(CPU, 1024)), "cpu=1024");
        assert_eq!(show(Resources::new().with_milli(CPU, u64::MAX)), "cpu=18446744073709551.615");
    }

    fn assert_round_trips(r: &Resources) {
        let text = r.to_string();
        assert_eq!(text.parse::<Resources>().as_ref(), Ok(r), "text {text:?}");
    }

    /// splitmix64: a small deterministic generator.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        }

        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
    }

    fn quantity(rng: &mut Rng) -> u64 {
        match rng.below(7) {
            0 => rng.next(),
            1 => rng.below(10_000),
            2 => rng.below(1000) * MILLI,
            // Whole bytes times a power of two, often with a suffix when displayed.
            3 => (rng.below(1 << 12) << rng.below(50)).saturating_mul(MILLI),
            4 => u64::MAX - rng.below(3),
            // Whole bytes times a power of ten, for the decimal units.
            5 => (rng.below(10_000) * 10u64.pow(rng.below(16) as u32)).saturating_mul(MILLI),
            _ => rng.next() >> rng.below(64),
        }
    }

    #[test]
    fn round_trips_generated_values() {
        let fixed = ["cpu", "mem", "memory", "disk", "gpu", "x", "a.b-c_d9"];
        let mut rng = Rng(42);
        for _ in 0..20_000 {
            let mut r = Resources::new();
            for _ in 0..rng.below(5) {
                let name = if rng.below(4) == 0 {
                    let len = 1 + rng.below(10) as usize;
                    let chars = b"abcdefghijklmnopqrstuvwxyz0123456789_-.";
                    (0..len)
                        .map(|i| char::from(chars[rng.below(if i == 0 { 26 } else { 39 }) as usize]))
                        .collect::<String>()
                } else {
                    fixed[rng.below(fixed.len() as u64) as usize].to_owned()
                };
                r = r.with_milli(&name, quantity(&mut rng));
            }
            assert_round_trips(&r);
        }
    }

    proptest! {
        #[test]
        fn round_trips_any_value(
            values in proptest::collection::btree_map("[a-z][a-z0-9_.-]{0,8}", any::<u64>(), 0..6),
            bytes in any::<u64>(),
            shift in 0u32..50,
        ) {
            let mut r = Resources::new();
            for (name, milli) in &values {
                r = r.with_milli(name, *milli);
            }
            r = r.with_milli(MEM, bytes).with(DISK, (bytes >> 50) << shift);
            assert_round_trips(&r);
        }
    }
}
