"""Resource vectors as the daemon writes them (``cpu=4,mem=16GiB``), in whole milli-units as
allot-core holds them, and the rule that picks among pool offers.

The text form is allot-core's (``Resources: FromStr`` in ``crates/allot-core/src/resources.rs``):
``testdata/resources.json`` is the table of cases that both, and the dashboard, are tested
against. The pick rule is the Rust client's ``allocate`` (``pick_n``, ``amount_to_take``), tested
against ``testdata/offer_picks.json``; ``docs/glossary.md`` states it.
"""

from __future__ import annotations

from typing import Dict, List, Mapping, Optional, Sequence, Tuple, TypeVar

#: Milli-units per unit.
MILLI = 1000
MAX_NAME_BYTES = 64
_MAX_MILLI = 2**64 - 1

_SCALES = {
    "k": 10**3, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15,
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50,
}  # fmt: skip
#: Milli-units per one of each unit: ``m``, none or ``B``, and each scale with or without ``B``.
_UNITS = {"": MILLI, "B": MILLI, "m": 1, **{u + b: s * MILLI for u, s in _SCALES.items() for b in ("", "B")}}

Resources = Dict[str, int]


class ResourcesError(ValueError):
    """A resource list allot refuses; ``kind`` names why as allot-core's ``ResourcesError`` does."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def parse_resources(text: str) -> Resources:
    """``cpu=2,mem=8GiB`` as milli-units per name (``{"cpu": 2000, "mem": 8589934592000}``);
    names at 0 left out. Raises :class:`ResourcesError` where the daemon would refuse the text."""
    resources: Resources = {}
    if not text.strip(" "):
        return resources
    for item in text.split(","):
        item = item.strip(" ")
        if not item:
            raise ResourcesError("EmptyItem", f"empty item in resource list `{text}`")
        name, equals, quantity = item.partition("=")
        if not equals:
            raise ResourcesError("MissingEquals", f"expected name=quantity, got `{item}`")
        name = _check_name(name.strip(" "))
        milli = _parse_quantity(name, quantity.strip(" "))
        if name in resources:  # zeros too: they are left out only at the end
            raise ResourcesError("Duplicate", f"resource `{name}` is given twice")
        resources[name] = milli
    return {name: milli for name, milli in resources.items() if milli > 0}


def _check_name(name: str) -> str:
    if not name:
        raise ResourcesError("EmptyName", "resource name must not be empty")
    if len(name.encode()) > MAX_NAME_BYTES:
        raise ResourcesError("NameTooLong", f"resource name `{name}` is longer than {MAX_NAME_BYTES} bytes")
    if not ("a" <= name[0] <= "z"):
        raise ResourcesError("NameStart", f"resource name `{name}` must start with a lowercase letter a-z")
    for c in name:
        if not ("a" <= c <= "z" or "0" <= c <= "9" or c in "_-."):
            raise ResourcesError("NameCharacter", f"resource name `{name}` contains `{c}`")
    return name


def _digits(text: str) -> str:
    """The ASCII digits ``text`` starts with."""
    end = 0
    while end < len(text) and "0" <= text[end] <= "9":
        end += 1
    return text[:end]


def _parse_quantity(name: str, quantity: str) -> int:
    def refuse(kind: str, why: str) -> ResourcesError:
        return ResourcesError(kind, f"resource quantity `{quantity}` for `{name}` {why}")

    if not quantity:
        raise ResourcesError("EmptyQuantity", f"resource `{name}` has no quantity")
    if quantity.startswith("-"):
        raise refuse("Negative", "is negative")
    whole = _digits(quantity)
    rest = quantity[len(whole) :]
    fraction = ""
    if rest.startswith("."):
        fraction = _digits(rest[1:])
        if not fraction:
            raise refuse("NotANumber", "is not a number")
        rest = rest[1 + len(fraction) :]
    if not whole:
        raise refuse("NotANumber", "is not a number")
    unit = rest.lstrip(" ")
    if unit not in _UNITS:
        raise refuse("UnknownUnit", f"has an unknown unit `{unit}`")
    if len(fraction) > 3:
        raise refuse("TooManyFractionalDigits", "has more than 3 fractional digits")
    scaled, denominator = int(whole + fraction) * _UNITS[unit], (1, 10, 100, 1000)[len(fraction)]
    if scaled % denominator:
        raise refuse("Inexact", "is not a whole number of thousandths")
    if scaled // denominator > _MAX_MILLI:
        raise refuse("TooLarge", "is too large")
    return scaled // denominator


def format_resources(resources: Mapping[str, int]) -> str:
    """The text form of milli-units per name, in plain units (``cpu=0.5,mem=8589934592``):
    :func:`parse_resources` reads it back to the same values."""
    return ",".join(f"{name}={_units(milli)}" for name, milli in sorted(resources.items()) if milli > 0)


def _units(milli: int) -> str:
    whole, thousandths = divmod(milli, MILLI)
    return f"{whole}.{thousandths:03d}".rstrip("0").rstrip(".")


def fits(wanted: Mapping[str, int], available: Mapping[str, int]) -> bool:
    """Whether ``available`` holds ``wanted``."""
    return all(available.get(name, 0) >= milli for name, milli in wanted.items())


#: Units of a name counted as one unit of size (allot-core's ``SizeWeights::default()``): 8 GiB
#: of mem counts like one cpu, one gpu like 8 cpu; a name not listed counts 1.
SIZE_DIVISORS = {"cpu": 1.0, "mem": 8.0 * 2**30, "memory": 8.0 * 2**30, "disk": 256.0 * 2**30, "gpu": 0.125}


def distance(a: Mapping[str, int], b: Mapping[str, int]) -> float:
    """allot-core's ``Resources::distance``: each name's difference in units over its divisor."""
    return sum(abs(a.get(n, 0) - b.get(n, 0)) / MILLI / SIZE_DIVISORS.get(n, 1.0) for n in sorted({*a, *b}))


Offer = TypeVar("Offer")

#: Codes of an accept whose offer went (or shrank) since it was read: the next pick is tried
#: (the Rust client's ``is_offer_gone``).
OFFER_GONE = ("offer_expired", "pool_stopped", "pool_not_found", "exceeds_capacity")


def pick_offers(
    offers: Sequence[Tuple[Offer, Resources]], wanted: Resources, most: Resources
) -> List[Tuple[Offer, Resources]]:
    """The offers (each with what it has) to try, best first, as the Rust client's ``pick_n``
    orders them: those that do not hold ``wanted`` left out; those that hold ``most`` first, then
    the others; each part by :func:`distance` of what the offer has to ``most``, nearest first;
    equal ones in their order."""
    ranked = sorted(
        (not fits(most, available), distance(available, most), i)
        for i, (_, available) in enumerate(offers)
        if fits(wanted, available)
    )
    return [offers[i] for _, _, i in ranked]


def amount_to_take(available: Resources, wanted: Resources, most: Optional[Resources]) -> Resources:
    """What to ask of an offer, as the Rust client's ``amount_to_take``: ``most`` (at least
    ``wanted``) capped by what the offer has; or the whole offer when what it would leave is
    useless: no cpu, no mem or no disk left of an offer that has some."""
    most = wanted if most is None else most
    names = {*wanted, *most}
    want = {n: min(max(wanted.get(n, 0), most.get(n, 0)), available.get(n, 0)) for n in names}
    want = {n: milli for n, milli in want.items() if milli > 0}
    useless = any(available.get(n, 0) > 0 and available.get(n, 0) - want.get(n, 0) <= 0 for n in ("cpu", "mem", "disk"))
    return dict(available) if useless else want
