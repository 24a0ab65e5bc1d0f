"""Numbers as a person reads them: the one place where figures become text, for the CLI, labs and app.

Standard library only, so `tutor.theory` may use it. The conventions:

- Three significant digits (more only where the integer part needs them: "1,023 MiB", "8,192 tokens"),
  trailing zeros dropped, thousands separators, never scientific notation ("7.4e-03") and never a repr.
- Bytes are binary (KiB, MiB, GiB, TiB: what CUDA and the OS report); `si_beside=True` adds the decimal
  figure that datasheets print ("80 GB" cards, bandwidths): "74.5 GiB (80 GB)".
- Rates (FLOP/s, B/s, tokens/s) and FLOP counts scale by decimal prefixes so the mantissa lies in 1..999:
  "7.4 GFLOP/s", not "0.0074 TFLOP/s"; "3.35 TB/s".
- Durations pick ns, µs, ms, s, then min/h: "7.4 ms", "2 min 5 s".
- Missing figures (None, NaN) read "N/A"; booleans "yes"/"no".
- Magnitudes no prefix can hold (below 10⁻⁶ or from 10¹⁵ on, unitless; past the largest prefix, with a
  unit) are written as powers of ten in words a reader knows: "5.96 × 10⁻⁸", not "5.96e-08";
  "3.8 × 10²⁵ FLOP", not "38,000,000 EFLOP".
"""

from __future__ import annotations

import math
from decimal import Decimal
from collections.abc import Iterable, Mapping
from typing import Any

NOT_AVAILABLE = "N/A"
SIGNIFICANT_DIGITS = 3

_DECIMAL_PREFIXES = ("", "k", "M", "G", "T", "P", "E")
_BINARY_BYTE_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB")
_DECIMAL_BYTE_UNITS = ("B", "kB", "MB", "GB", "TB", "PB", "EB")
_COUNT_SUFFIXES = ("", "K", "M", "B", "T")  # model cards: 124M, 8.03B parameters
# Units that take a decimal prefix glued on: kFLOP/s .. PFLOP/s, kB/s .. TB/s. Every other unit is a
# count of things ("tokens", "tokens/s", "steps"): whole below a million ("8,192"), then 1.5M, 2.1B.
_PREFIXED_BASES = ("FLOP/s", "FLOPS", "FLOPs", "FLOP", "OP/s", "B/s", "bit/s", "Hz", "W")
_SECONDS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "sec": 1.0,
            "min": 60.0, "h": 3600.0}
_SUPERSCRIPT = str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹")
_SMALLEST_PLAIN = 1e-6   # below this a decimal fraction has too many zeros to read
_LARGEST_PLAIN = 1e15    # from here on a digit string is too long to read


def _nan(value: object) -> bool:
    """A NaN float: shown as missing, like None (tested apart so that `x is None or _nan(x)` narrows x)."""
    return isinstance(value, float) and math.isnan(value)


def _powers_of_ten(value: float, digits: int) -> str:
    """'5.96 × 10⁻⁸': the mantissa to `digits` significant digits, the exponent in superscript.
    Read from Python's own e-format, so subnormals (5e-324) and 9.996 rounding up stay exact."""
    mantissa, exponent = f"{value:.{digits - 1}e}".split("e")
    return f"{_strip_zeros(mantissa)} × 10{str(int(exponent)).translate(_SUPERSCRIPT)}"


def _strip_zeros(text: str) -> str:
    return text.rstrip("0").rstrip(".") if "." in text else text


def format_number(value: float | None, *, digits: int = SIGNIFICANT_DIGITS) -> str:
    """A bare number: `digits` significant digits (all of the integer part), thousands separators,
    trailing zeros dropped; whole numbers exactly ("8,192"); "N/A" when missing; "inf" as IEEE 754 names it."""
    if value is None or _nan(value):
        return NOT_AVAILABLE
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int) and abs(value) < _LARGEST_PLAIN:
        return f"{value:,}"
    value = float(value)
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    if value == 0:
        return "0"
    magnitude = abs(value)
    if magnitude < _SMALLEST_PLAIN or magnitude >= _LARGEST_PLAIN:
        return _powers_of_ten(value, digits)
    if value.is_integer():
        return f"{int(value):,}"
    decimals = max(0, digits - 1 - math.floor(math.log10(magnitude)))
    text = _strip_zeros(f"{value:,.{decimals}f}")
    return "0" if text in ("-0", "0") else text


def format_exact(value: float | str | None) -> str:
    """The shortest decimal that reads back as the same float (Python's repr), written out without
    an exponent: 0.1 -> '0.1', 65504.0 -> '65,504', 1e-05 -> '0.00001', 2**-24 -> '5.960464477539063 × 10⁻⁸'
    (below 10⁻⁶ and from 10¹⁵ on, repr's digits times a power of ten)."""
    if value is None or _nan(value) or isinstance(value, bool) or math.isinf(float(value)):
        return format_number(float(value) if isinstance(value, str) else value)
    shortest = Decimal(repr(float(value)))
    digits = max(1, len(shortest.as_tuple().digits))
    magnitude = abs(float(value))
    if magnitude and (magnitude < _SMALLEST_PLAIN or magnitude >= _LARGEST_PLAIN):
        sign, figures, _ = shortest.as_tuple()
        mantissa = f"{'-' if sign else ''}{figures[0]}" + (f".{''.join(map(str, figures[1:]))}" if digits > 1 else "")
        return f"{mantissa} × 10{str(shortest.adjusted()).translate(_SUPERSCRIPT)}"
    text = _strip_zeros(f"{shortest:,f}")
    return "0" if text in ("-0", "0") else text


def _scaled(value: float, base: float, units: tuple[str, ...], *, digits: int, start: int = 0) -> tuple[str, str]:
    """(mantissa text, unit): the unit from `units` (each `base` times the last) that puts the
    mantissa in 1..base, starting from units[start], the unit `value` is in. Past the largest unit's
    range, a power of ten of the smallest unit: '3.8 × 10²⁵ FLOP', not '38,000,000 EFLOP'."""
    in_first_unit = value * base ** start
    if abs(in_first_unit) >= base ** len(units) and not math.isinf(in_first_unit):
        return _powers_of_ten(in_first_unit, digits), units[0]
    index, magnitude = start, abs(value)
    if magnitude:
        while index > 0 and magnitude < 1:
            magnitude, value, index = magnitude * base, value * base, index - 1
        while index < len(units) - 1 and magnitude >= base:
            magnitude, value, index = magnitude / base, value / base, index + 1
    text = format_number(value, digits=digits)
    if _shown_magnitude(text) >= base and math.isfinite(value):  # 1023.7 KiB shows as 1,024: say 1 MiB
        if index == len(units) - 1:  # 999.6 EFLOP shows as 1,000: past the largest unit too
            return _powers_of_ten(in_first_unit, digits), units[0]
        value, index = value / base, index + 1
        text = format_number(value, digits=digits)
    return text, units[index]


def _shown_magnitude(text: str) -> float:
    try:
        return abs(float(text.replace(",", "")))
    except ValueError:  # powers of ten: beyond every unit's range anyway
        return 0.0


def format_bytes(n_bytes: float | None, *, si_beside: bool = False, digits: int = SIGNIFICANT_DIGITS) -> str:
    """A size in binary units: '512 B', '16.1 KiB', '1.5 GiB'; with `si_beside`, the decimal size
    datasheets print beside it: '74.5 GiB (80 GB)' (IEC 80000-13: Ki = 2**10, k = 10**3)."""
    if n_bytes is None or _nan(n_bytes):
        return NOT_AVAILABLE
    if n_bytes == 0:
        return "0 B"
    if abs(n_bytes) < 1:
        return f"{format_number(float(n_bytes), digits=digits)} B"
    mantissa, unit = _scaled(n_bytes, 1024, _BINARY_BYTE_UNITS, digits=digits)
    text = f"{mantissa} {unit}"
    if si_beside and abs(n_bytes) >= 1000:
        return f"{text} ({format_decimal_bytes(n_bytes, digits=digits)})"
    return text


def format_decimal_bytes(n_bytes: float | None, *, digits: int = SIGNIFICANT_DIGITS) -> str:
    """A size in decimal units as datasheets print them: '80 GB', '1.61 GB', '512 B'."""
    if n_bytes is None or _nan(n_bytes):
        return NOT_AVAILABLE
    mantissa, unit = _scaled(n_bytes, 1000, _DECIMAL_BYTE_UNITS, digits=digits)
    return f"{mantissa} {unit}"


def format_rate(value: float | None, unit: str, *, digits: int = SIGNIFICANT_DIGITS) -> str:
    """A rate in `unit` ("FLOP/s", "TFLOP/s", "B/s", "GB/s", "tokens/s") rescaled to the decimal
    prefix that puts the mantissa in 1..999: (0.007446, "TFLOP/s") -> '7.45 GFLOP/s'."""
    return format_quantity(value, unit, digits=digits)


def format_count(n: float | None, *, exact: bool = False, digits: int = SIGNIFICANT_DIGITS) -> str:
    """A count the way model cards write it, '8.03B', '124M', '12.9K', '512';
    with `exact`, every digit: '8,030,261,248'."""
    if n is None or _nan(n):
        return NOT_AVAILABLE
    if exact:
        return f"{round(n):,}"
    if abs(n) < 1000:
        return format_number(n, digits=digits)
    mantissa, suffix = _scaled(float(n), 1000, _COUNT_SUFFIXES, digits=digits)
    return f"{mantissa}{suffix}"


def format_percent(fraction: float | None, *, digits: int = SIGNIFICANT_DIGITS) -> str:
    """A fraction as a percentage: 0.859 -> '85.9%', 0.003 -> '0.3%', 1.0 -> '100%'."""
    if fraction is None or _nan(fraction):
        return NOT_AVAILABLE
    return f"{format_number(fraction * 100, digits=digits)}%"


def format_duration(seconds: float | None, *, digits: int = SIGNIFICANT_DIGITS) -> str:
    """A time span: '850 ns', '12.5 µs', '7.4 ms', '3.2 s', '2 min 5 s', '3 h 20 min', '2 d 4 h'."""
    if seconds is None or _nan(seconds):
        return NOT_AVAILABLE
    seconds = float(seconds)
    if math.isinf(seconds):
        return "forever" if seconds > 0 else "-inf s"
    sign, seconds = ("-" if seconds < 0 else ""), abs(seconds)
    if seconds == 0:
        return "0 s"
    if seconds < 59.95:
        for unit, size in (("ns", 1e-9), ("µs", 1e-6), ("ms", 1e-3)):
            if seconds < size * 999.5:
                return f"{sign}{format_number(seconds / size, digits=digits)} {unit}"
        return f"{sign}{format_number(seconds, digits=digits)} s"
    minutes = round(seconds / 60)
    if seconds < 3600 - 0.5:
        whole, rest = divmod(round(seconds), 60)
        return f"{sign}{whole} min" + (f" {rest} s" if rest else "")
    if minutes < 24 * 60:
        hours, rest = divmod(minutes, 60)
        return f"{sign}{hours} h" + (f" {rest} min" if rest else "")
    days, rest = divmod(round(seconds / 3600), 24)
    return f"{sign}{days:,} d" + (f" {rest} h" if rest else "")


def format_durations_apart(first: float, second: float, *, digits: int = SIGNIFICANT_DIGITS) -> tuple[str, str]:
    """Two different time spans, each as format_duration writes it, with as many more significant digits
    as it takes for the texts to differ ('500.4 ms' beside '500 ms', never '500 ms' beside '500 ms')."""
    shown = (format_duration(first, digits=digits), format_duration(second, digits=digits))
    while first != second and shown[0] == shown[1] and digits < 12:
        digits += 1
        shown = (format_duration(first, digits=digits), format_duration(second, digits=digits))
    return shown


def _split_prefix(unit: str) -> tuple[int, str] | None:
    """(power of 1000, base unit) for 'TFLOP/s' -> (4, 'FLOP/s'), 'GB/s' -> (3, 'B/s'); None if not prefixed."""
    for base in _PREFIXED_BASES:
        if unit == base:
            return 0, base
        if unit.endswith(base) and len(unit) == len(base) + 1:
            prefix = unit[0]
            prefix = "k" if prefix == "K" else prefix
            if prefix in _DECIMAL_PREFIXES:
                return _DECIMAL_PREFIXES.index(prefix), base
    return None


def format_quantity(value: object, unit: str = "", *, digits: int = SIGNIFICANT_DIGITS) -> str:
    """Any figure with its unit, rescaled to read well: (0.0074, 'TFLOP/s') -> '7.4 GFLOP/s',
    (16510, 'B') -> '16.1 KiB', (0.0074, 's') -> '7.4 ms', (85.9, '%') -> '85.9%', (3.2, 'x') -> '3.2x',
    (8192, 'tokens') -> '8,192 tokens', (True, '') -> 'yes', None -> 'N/A'.

    Byte units keep their family: 'B', 'bytes' and 'KiB'..'TiB' are shown binary, 'kB'..'TB' and
    'B/s'..'TB/s' decimal (datasheets). '%' takes a value already in percent."""
    unit = (unit or "").strip()
    if isinstance(value, bool):
        return "yes" if value else "no"
    if value is None or _nan(value):
        return NOT_AVAILABLE
    if not isinstance(value, (int, float)):
        return f"{value} {unit}".strip()
    if unit in ("B", "byte", "bytes"):
        return format_bytes(value, digits=digits)
    if unit in _BINARY_BYTE_UNITS:
        return format_bytes(value * 1024 ** _BINARY_BYTE_UNITS.index(unit), digits=digits)
    if unit in ("kB", "KB", "MB", "GB", "TB", "PB"):
        return format_decimal_bytes(value * 1000 ** _DECIMAL_PREFIXES.index(unit[0].replace("K", "k")),
                                    digits=digits)
    if unit in _SECONDS:
        return format_duration(value * _SECONDS[unit], digits=digits)
    if unit == "fraction":  # a share of 1, read as a percentage
        return format_percent(value, digits=digits)
    if unit == "%":
        return f"{format_number(value, digits=digits)}%"
    if unit in ("x", "×"):
        return f"{format_number(value, digits=digits)}x"
    prefixed = _split_prefix(unit)
    if prefixed is not None and not (isinstance(value, float) and math.isinf(value)):
        power, base = prefixed
        units = tuple(p + base for p in _DECIMAL_PREFIXES)
        mantissa, scaled_unit = _scaled(float(value), 1000, units, digits=digits, start=power)
        return f"{mantissa} {scaled_unit}"
    if abs(value) >= 1e6 and not (isinstance(value, float) and math.isinf(value)):  # 1.5B tokens, 15T tokens
        return f"{format_count(value, digits=digits)} {unit}".strip()
    return f"{format_number(value, digits=digits)} {unit}".strip()


def _parameter_value(key: str, value: object) -> tuple[str, str]:
    """(label, text) for one lab parameter: 'budget_s', 3 -> ('budget', '3 s')."""
    for suffix, unit in (("_s", "s"), ("_ms", "ms"), ("_bytes", "B"), ("_mb", "MB"), ("_gb", "GB"),
                         ("_mib", "MiB"), ("_gib", "GiB")):
        if key.endswith(suffix) and isinstance(value, (int, float)) and not isinstance(value, bool):
            return key[: -len(suffix)].replace("_", " "), format_quantity(value, unit)
    label = key.replace("_", " ")
    if isinstance(value, (list, tuple)):
        return label, ", ".join(format_quantity(v) if isinstance(v, (int, float)) else str(v) for v in value)
    if isinstance(value, (int, float)) or value is None:
        return label, format_quantity(value)
    return label, str(value)


def format_params(params: Mapping[str, object]) -> str:
    """A lab's parameters on one line, no reprs: {'dtypes': ['fp32'], 'budget_s': 3} -> 'dtypes fp32 · budget 3 s'."""
    return " · ".join(" ".join(_parameter_value(key, value)) for key, value in params.items())


def axis_unit(largest: float, unit: str) -> tuple[float, str]:
    """(factor, unit) for a chart axis whose values are in `unit` and reach `largest`: the decimal
    prefix format_quantity would show `largest` with, so the tick labels read 1..999:
    (0.18, 'TFLOP/s') -> (1000.0, 'GFLOP/s'); (3e7, 'B') -> (1 / 2**20, 'MiB'). Unknown units: (1, unit)."""
    if unit in ("B", "bytes"):
        power = 0
        while largest >= 1024 and power < len(_BINARY_BYTE_UNITS) - 1:
            largest /= 1024
            power += 1
        return 1 / 1024 ** power, ("B", *_BINARY_BYTE_UNITS[1:])[power] if power else "B"
    prefixed = _split_prefix(unit)
    if prefixed is None or _nan(largest) or largest <= 0:
        return 1.0, unit
    power, base = prefixed
    target = power
    value = largest
    while value >= 1000 and target < len(_DECIMAL_PREFIXES) - 1:
        value /= 1000
        target += 1
    while value < 1 and target > 0:
        value *= 1000
        target -= 1
    return 1000.0 ** (power - target), _DECIMAL_PREFIXES[target] + base


def column_units(figures: Iterable[tuple[float | None, str]]) -> dict[str, tuple[float, str]]:
    """unit -> (factor, unit shown) for a table whose figures are (value, unit) pairs: every figure of
    one unit is shown in the unit its largest reads best with (axis_unit), so a column reads in one
    unit from row to row ('120 GFLOP/s' beside '269 GFLOP/s', never beside '1.2 TFLOP/s') and an
    export can name that unit in its header: ((0.12, 'TFLOP/s'), (0.27, 'TFLOP/s')) -> {'TFLOP/s':
    (1000.0, 'GFLOP/s')}. Units axis_unit does not scale keep factor 1."""
    largest: dict[str, float] = {}
    for value, unit in figures:
        magnitude = abs(value) if isinstance(value, (int, float)) and not _nan(value) else 0.0
        largest[unit] = max(largest.get(unit, 0.0), 0.0 if math.isinf(magnitude) else magnitude)
    return {unit: axis_unit(top, unit) for unit, top in largest.items()}


def format_in_unit(value: float | None, scale: tuple[float, str], *, digits: int = SIGNIFICANT_DIGITS) -> str:
    """A figure in a unit chosen for its column (column_units' (factor, unit)): (0.12, (1000.0, 'GFLOP/s'))
    -> '120 GFLOP/s'; (0.0004, (1000.0, 'GFLOP/s')) -> '0.4 GFLOP/s'; None -> 'N/A'."""
    if value is None or _nan(value):
        return NOT_AVAILABLE
    factor, unit = scale
    text = format_number(value * factor, digits=digits)
    if unit == "%":
        return f"{text}%"
    return f"{text} {unit}".strip()


def _si_rate(value: float) -> str:
    """A rate in whatever unit the caller compares (FLOP/s or B/s), with an SI prefix: '5 T', '820 G'."""
    for unit, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6)):
        if abs(value) >= scale:
            return f"{format_number(value / scale)} {unit}"
    return format_number(value)


def efficiency_summary(efficiency: Any) -> str:
    """tutor.theory.peaks.explain_efficiency's Efficiency in words: its share of the peak, or, above the peak,
    which assumption failed (the clock the peak was computed at, and the least clock the measurement implies)."""
    if efficiency.peak is None:
        return "no theoretical peak known: measured only"
    if not efficiency.exceeds_peak:
        return f"{efficiency.fraction:.1%} of the theoretical peak"
    if efficiency.implied_clock_hz is None or efficiency.assumed_clock_hz is None:
        return (f"above the theoretical peak ({_si_rate(efficiency.measured)} > {_si_rate(efficiency.peak)}): "
                "an assumption behind the peak (clock, units per core) is wrong")
    return (f"above the peak computed at {efficiency.assumed_clock_hz / 1e9:.2f} GHz: the clock must have been at "
            f"least {efficiency.implied_clock_hz / 1e9:.2f} GHz")
