//! Parsers for values as the kubelet writes them: quantities, percentages and
//! durations.
//!
//! The kubelet's eviction settings mix three syntaxes: resource quantities
//! (`memory.available<100Mi`, `imagefs.available<15Gi`), percentages
//! (`nodefs.available<10%`, `nodefs.inodesFree<5%`) and Go
//! durations (`evictionPressureTransitionPeriod: 5m`,
//! `evictionSoftGracePeriod: memory.available=1m30s`). criguard has to read
//! them exactly as the kubelet does, or it would act on a different threshold
//! than the one the operator configured. Every function here is pure and
//! total: it returns a value or a [`QuantityError`] naming the bad input, and
//! never panics.
//!
//! Trade-offs:
//!
//! - **Quantities** follow apimachinery's `resource.Quantity` grammar but are
//!   returned as a whole `u64` count of units (bytes, inodes, pids), rounding
//!   any fraction *up*, as `Quantity.Value()` does. The arithmetic is exact
//!   integer arithmetic on the decimal digits (never `f64`), so `1.5Gi` is
//!   exactly 1610612736 and `0.1` is 1. Negative quantities are rejected
//!   rather than represented: no kubelet threshold is negative.
//! - **Percentages** are returned as `f64`: they are only ever used as a
//!   ratio of a capacity, where `f64` precision is ample. The range check
//!   `(0, 100]` is done on the decimal digits, so it is exact.
//! - **Durations** mirror Go's `time.ParseDuration`, including its quirks:
//!   sub-nanosecond fractions are truncated, a bare `0` needs no unit, and
//!   the total must fit in Go's `int64` nanoseconds (about 292 years).
//!   Negative durations are rejected.
//! - Nothing is trimmed: whitespace anywhere is an error, so callers decide
//!   what surrounding whitespace means.
//! - The formatters are for humans and logs. [`format_duration`] is exact and
//!   round-trips through [`parse_duration`]; [`format_bytes`] is exact when a
//!   binary suffix divides the value and otherwise rounds to one decimal.

use std::time::Duration;

/// Why a kubelet value could not be parsed; every message names the
/// offending input string.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    /// The input was the empty string.
    #[error("empty value")]
    Empty,
    /// The input is not a quantity: bad digits, an unknown suffix,
    /// whitespace, or trailing characters.
    #[error(
        "malformed quantity {input:?}: expected a number with an optional suffix \
         (Ki, Mi, Gi, Ti, Pi, Ei, n, u, m, k, M, G, T, P, E or an exponent like e3)"
    )]
    Malformed {
        /// The input as given.
        input: String,
    },
    /// The input is a well-formed but negative quantity.
    #[error("negative quantity {input:?}: only values >= 0 are allowed")]
    Negative {
        /// The input as given.
        input: String,
    },
    /// The value does not fit: more than `u64::MAX` units for a quantity, or
    /// more than Go's `int64` nanoseconds for a duration.
    #[error("value {input:?} is too large")]
    TooLarge {
        /// The input as given.
        input: String,
    },
    /// The input is not a number followed by `%`, or the number is outside
    /// `(0, 100]`.
    #[error("invalid percentage {input:?}: expected a number in (0, 100] followed by %")]
    Percentage {
        /// The input as given.
        input: String,
    },
    /// The input is not a Go duration.
    #[error(
        "invalid duration {input:?}: expected e.g. 300ms, 1.5h, 2h45m or 1m30s \
         (units ns, us, µs, ms, s, m, h)"
    )]
    Duration {
        /// The input as given.
        input: String,
    },
    /// The input is a well-formed but negative duration.
    #[error("negative duration {input:?}: only durations >= 0 are allowed")]
    NegativeDuration {
        /// The input as given.
        input: String,
    },
}

/// Parses a Kubernetes quantity (`resource.Quantity` syntax) into a whole
/// number of units (bytes, inodes, pids), rounding any fraction UP.
///
/// Accepted: an optional `+`, digits with an optional decimal point (`5`,
/// `.5`, `5.`), then nothing, a binary suffix (`Ki` … `Ei`, powers of 1024),
/// a decimal suffix (`n`, `u`, `m`, `k`, `M`, `G`, `T`, `P`, `E`; lowercase
/// `m` is milli, uppercase `M` mega) or a decimal exponent (`e3`, `E-1`).
/// So `"1.5Gi"` is 1610612736, `"1500m"` is 2 and `"1e3"` is 1000.
///
/// A leading `-` on an otherwise valid quantity gives
/// [`QuantityError::Negative`] (even for `-0`); more than `u64::MAX` units
/// gives [`QuantityError::TooLarge`].
pub fn parse_quantity(s: &str) -> Result<u64, QuantityError> {
    if s.is_empty() {
        return Err(QuantityError::Empty);
    }
    let malformed = || QuantityError::Malformed {
        input: s.to_owned(),
    };
    let (negative, body) = split_sign(s);
    let (number, suffix) = split_decimal(body).ok_or_else(malformed)?;
    let scale = parse_suffix(suffix).ok_or_else(malformed)?;
    if negative {
        return Err(QuantityError::Negative {
            input: s.to_owned(),
        });
    }
    scale_up(number, scale).ok_or_else(|| QuantityError::TooLarge {
        input: s.to_owned(),
    })
}

/// Parses a percentage such as `"10%"` or `"0.5%"` and returns the number
/// (`10.0`, `0.5`).
///
/// The number is digits with an optional decimal point and an optional
/// leading `+`; it must be in `(0, 100]`, checked exactly on the digits.
/// Anything else, including a missing `%`, gives
/// [`QuantityError::Percentage`].
pub fn parse_percentage(s: &str) -> Result<f64, QuantityError> {
    if s.is_empty() {
        return Err(QuantityError::Empty);
    }
    let invalid = || QuantityError::Percentage {
        input: s.to_owned(),
    };
    let body = s.strip_suffix('%').ok_or_else(invalid)?;
    let body = body.strip_prefix('+').unwrap_or(body);
    let number = match split_decimal(body) {
        Some((number, "")) => number,
        _ => return Err(invalid()),
    };
    if !number.in_percent_range() {
        return Err(invalid());
    }
    let value = number.to_f64();
    if value > 0.0 {
        Ok(value)
    } else {
        Err(invalid())
    }
}

/// Parses a Go `time.Duration` string such as `"300ms"`, `"1.5h"`,
/// `"2h45m"`, `"1m30s"`, `"5m"` or `"0"`.
///
/// Units are `ns`, `us`, `µs` (or `μs`), `ms`, `s`, `m` and `h`; every
/// component needs one, except for a bare `0`. As in Go, fractions finer
/// than a nanosecond are truncated and the total must fit in an `int64` of
/// nanoseconds ([`QuantityError::TooLarge`] otherwise). A leading `-` gives
/// [`QuantityError::NegativeDuration`].
pub fn parse_duration(s: &str) -> Result<Duration, QuantityError> {
    if s.is_empty() {
        return Err(QuantityError::Empty);
    }
    let invalid = || QuantityError::Duration {
        input: s.to_owned(),
    };
    let (negative, mut rest) = split_sign(s);
    // `total` becomes None on overflow; the syntax is still checked to the end
    // so that a malformed input is reported as malformed, not as too large.
    let mut total = Some(0u128);
    if rest != "0" {
        if rest.is_empty() {
            return Err(invalid());
        }
        while !rest.is_empty() {
            let (number, after) = split_decimal(rest).ok_or_else(invalid)?;
            let unit_len = after
                .find(|c: char| c.is_ascii_digit() || c == '.')
                .unwrap_or(after.len());
            let (unit, after) = after.split_at(unit_len);
            let per_unit = unit_nanos(unit).ok_or_else(invalid)?;
            total = total
                .zip(number.nanos(per_unit))
                .and_then(|(a, b)| a.checked_add(b));
            rest = after;
        }
    }
    if negative {
        return Err(QuantityError::NegativeDuration {
            input: s.to_owned(),
        });
    }
    total
        .and_then(|n| u64::try_from(n).ok())
        .filter(|&n| n <= GO_MAX_DURATION_NANOS)
        .map(Duration::from_nanos)
        .ok_or_else(|| QuantityError::TooLarge {
            input: s.to_owned(),
        })
}

/// Formats a byte count for humans and logs.
///
/// Exact when possible: the largest binary suffix that divides the value
/// (`"100Mi"`, `"1536Ki"`), or the plain number below 1024 (`"7"`). Otherwise
/// the value is rounded to one decimal with the largest suffix not above it
/// (`"1.5Ki"` for 1536, `"1.5Gi"` for 1610612737); such output contains a
/// decimal point and is approximate.
pub fn format_bytes(n: u64) -> String {
    if n < 1024 {
        return n.to_string();
    }
    if let Some(&(suffix, shift)) = BINARY
        .iter()
        .find(|&&(_, shift)| n.is_multiple_of(1 << shift))
    {
        return format!("{}{suffix}", n >> shift);
    }
    let mut i = BINARY
        .iter()
        .position(|&(_, shift)| n >> shift > 0)
        .unwrap_or(BINARY.len() - 1);
    let mut tenths = rounded_tenths(n, BINARY[i].1);
    // Rounding may reach 1024.0 of a suffix: say 1.0 of the next one instead.
    if tenths >= 10 * 1024 && i > 0 {
        i -= 1;
        tenths = rounded_tenths(n, BINARY[i].1);
    }
    format!("{}.{}{}", tenths / 10, tenths % 10, BINARY[i].0)
}

/// Formats a duration the way Go's `Duration.String` does: `"1m30s"`,
/// `"5m0s"`, `"1h30m0s"`, `"1.5s"`, `"300ms"`, `"1.5µs"`, `"0s"`.
///
/// Exact (no rounding), so the result parses back with [`parse_duration`]
/// whenever it is within Go's range.
pub fn format_duration(d: Duration) -> String {
    let secs = d.as_secs();
    let nanos = d.subsec_nanos();
    if secs == 0 {
        return match nanos {
            0 => "0s".to_owned(),
            n if n < 1_000 => format!("{n}ns"),
            n if n < 1_000_000 => {
                format!("{}µs", with_fraction(u64::from(n / 1_000), n % 1_000, 3))
            }
            n => format!(
                "{}ms",
                with_fraction(u64::from(n / 1_000_000), n % 1_000_000, 6)
            ),
        };
    }
    let (hours, minutes, seconds) = (secs / 3600, secs / 60 % 60, secs % 60);
    let mut out = String::new();
    if hours > 0 {
        out.push_str(&format!("{hours}h"));
    }
    if hours > 0 || minutes > 0 {
        out.push_str(&format!("{minutes}m"));
    }
    out.push_str(&with_fraction(seconds, nanos, 9));
    out.push('s');
    out
}

/// Binary suffixes, largest first, with their power of two.
const BINARY: [(&str, u32); 6] = [
    ("Ei", 60),
    ("Pi", 50),
    ("Ti", 40),
    ("Gi", 30),
    ("Mi", 20),
    ("Ki", 10),
];

/// Go's largest `time.Duration`, in nanoseconds.
const GO_MAX_DURATION_NANOS: u64 = i64::MAX as u64;

/// A quantity below 10^-20 units is nonzero yet below 1 even after the
/// largest multiplier (2^60 < 10^19), so it rounds up to exactly 1.
const MIN_POINT: i64 = -19;

/// A quantity with more than 20 integer digits is at least 10^20, which
/// exceeds `u64::MAX` (about 1.8 * 10^19).
const MAX_POINT: i64 = 20;

/// An unsigned decimal number as written: the digits before and after the
/// decimal point, ASCII digits only, not both empty.
#[derive(Debug, Clone, Copy)]
struct Decimal<'a> {
    int: &'a str,
    frac: &'a str,
}

/// What a quantity's suffix multiplies the number by: `10^pow10 * 2^pow2`.
#[derive(Debug, Clone, Copy)]
struct Scale {
    pow10: i64,
    pow2: u32,
}

/// Strips one leading sign; returns whether it was `-`, and the rest.
fn split_sign(s: &str) -> (bool, &str) {
    match s.as_bytes().first() {
        Some(b'-') => (true, &s[1..]),
        Some(b'+') => (false, &s[1..]),
        _ => (false, s),
    }
}

/// Splits a leading decimal number (`12`, `1.5`, `.5`, `5.`) off `s`.
fn split_decimal(s: &str) -> Option<(Decimal<'_>, &str)> {
    let (int, rest) = s.split_at(count_digits(s));
    let (frac, rest) = match rest.strip_prefix('.') {
        Some(after) => after.split_at(count_digits(after)),
        None => ("", rest),
    };
    if int.is_empty() && frac.is_empty() {
        return None;
    }
    Some((Decimal { int, frac }, rest))
}

/// The number of leading ASCII digits of `s`.
fn count_digits(s: &str) -> usize {
    s.bytes().take_while(u8::is_ascii_digit).count()
}

/// The value of one ASCII digit.
fn digit(b: u8) -> u8 {
    b - b'0'
}

/// Reads a quantity suffix; `None` if it is not one.
fn parse_suffix(suffix: &str) -> Option<Scale> {
    let (pow10, pow2) = match suffix {
        "" => (0, 0),
        "n" => (-9, 0),
        "u" => (-6, 0),
        "m" => (-3, 0),
        "k" => (3, 0),
        "M" => (6, 0),
        "G" => (9, 0),
        "T" => (12, 0),
        "P" => (15, 0),
        "E" => (18, 0),
        "Ki" => (0, 10),
        "Mi" => (0, 20),
        "Gi" => (0, 30),
        "Ti" => (0, 40),
        "Pi" => (0, 50),
        "Ei" => (0, 60),
        _ => (parse_exponent(suffix)?, 0),
    };
    Some(Scale { pow10, pow2 })
}

/// Reads a decimal exponent such as `e3`, `E-1` or `e+6`. Huge exponents
/// saturate, which cannot change the outcome (zero, 1 or too large).
fn parse_exponent(s: &str) -> Option<i64> {
    let signed = s.strip_prefix(['e', 'E'])?;
    let (negative, digits) = split_sign(signed);
    if digits.is_empty() || count_digits(digits) != digits.len() {
        return None;
    }
    let magnitude = digits.bytes().fold(0i64, |acc, b| {
        acc.saturating_mul(10).saturating_add(i64::from(digit(b)))
    });
    Some(if negative { -magnitude } else { magnitude })
}

/// `ceil(number * 10^pow10 * 2^pow2)`, exactly; `None` above `u64::MAX`.
fn scale_up(number: Decimal<'_>, scale: Scale) -> Option<u64> {
    let digits: Vec<u8> = number
        .int
        .bytes()
        .chain(number.frac.bytes())
        .map(digit)
        .collect();
    let Some(first) = digits.iter().position(|&d| d != 0) else {
        return Some(0);
    };
    let last = digits.iter().rposition(|&d| d != 0).unwrap_or(first);
    // The value is 0.d1d2…dn * 10^point, with d1 and dn nonzero.
    let significant = &digits[first..=last];
    let point = (number.int.len() as i64 - first as i64).saturating_add(scale.pow10);
    if point > MAX_POINT {
        return None;
    }
    if point < MIN_POINT {
        return Some(1);
    }
    let len = significant.len() as i64;
    let (int_digits, frac_digits) = significant.split_at(point.clamp(0, len) as usize);
    // Both at most 20 by the checks above, which keeps the integer part
    // below 10^20 and its product with 2^60 well inside u128.
    let int_zeros = (point - len).max(0) as u32;
    let frac_zeros = (-point).max(0) as usize;
    let multiplier = 1u128 << scale.pow2;
    let int = int_digits
        .iter()
        .fold(0u128, |acc, &d| acc * 10 + u128::from(d))
        * 10u128.pow(int_zeros);
    // ceil(0.f1f2…fk * multiplier) by Horner's rule from the last digit:
    // ceil((d * m + x) / 10) == ceil((d * m + ceil(x)) / 10) for integer d * m.
    let frac = frac_digits
        .iter()
        .rev()
        .chain(std::iter::repeat_n(&0, frac_zeros))
        .fold(0u128, |acc, &d| {
            (u128::from(d) * multiplier + acc).div_ceil(10)
        });
    u64::try_from(int * multiplier + frac).ok()
}

/// Nanoseconds in one duration unit; `None` for an unknown unit.
fn unit_nanos(unit: &str) -> Option<u64> {
    Some(match unit {
        "ns" => 1,
        "us" | "µs" | "μs" => 1_000,
        "ms" => 1_000_000,
        "s" => 1_000_000_000,
        "m" => 60_000_000_000,
        "h" => 3_600_000_000_000,
        _ => return None,
    })
}

/// `round(n / 2^shift, 1 decimal)`, in tenths.
fn rounded_tenths(n: u64, shift: u32) -> u128 {
    let unit = 1u128 << shift;
    (u128::from(n) * 10 + unit / 2) / unit
}

/// `whole` followed by `frac` as a `digits`-digit fraction without its
/// trailing zeros, or no fraction at all when `frac` is 0.
fn with_fraction(whole: u64, frac: u32, digits: usize) -> String {
    if frac == 0 {
        return whole.to_string();
    }
    let frac = format!("{frac:0digits$}");
    format!("{whole}.{}", frac.trim_end_matches('0'))
}

impl Decimal<'_> {
    /// Whether the number lies in `(0, 100]`, decided on the digits.
    fn in_percent_range(self) -> bool {
        let int = self.int.trim_start_matches('0');
        let frac_nonzero = self.frac.bytes().any(|b| b != b'0');
        match int {
            "" => frac_nonzero,
            "100" => !frac_nonzero,
            _ => int.len() < 3,
        }
    }

    /// The number as an `f64` (nearest value).
    fn to_f64(self) -> f64 {
        let int = if self.int.is_empty() { "0" } else { self.int };
        let frac = if self.frac.is_empty() { "0" } else { self.frac };
        format!("{int}.{frac}").parse().unwrap_or(f64::NAN)
    }

    /// `floor(number * per_unit)` nanoseconds, as Go computes a duration
    /// component; `None` on overflow.
    fn nanos(self, per_unit: u64) -> Option<u128> {
        let per_unit = u128::from(per_unit);
        let int = self.int.bytes().try_fold(0u128, |acc, b| {
            acc.checked_mul(10)?.checked_add(u128::from(digit(b)))
        })?;
        // floor(0.f1f2…fk * unit) by Horner's rule from the last digit; the
        // running value stays below `per_unit`.
        let frac = self
            .frac
            .bytes()
            .rev()
            .fold(0u128, |acc, b| (u128::from(digit(b)) * per_unit + acc) / 10);
        int.checked_mul(per_unit)?.checked_add(frac)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const KI: u64 = 1 << 10;
    const MI: u64 = 1 << 20;
    const GI: u64 = 1 << 30;

    #[test]
    fn quantities_from_the_kubelet_docs() {
        // Values from the kubelet's eviction and reservation documentation.
        let cases: &[(&str, u64)] = &[
            ("100Mi", 100 * MI),
            ("1Gi", GI),
            ("1.5Gi", 1_610_612_736),
            ("500Mi", 500 * MI),
            ("0Mi", 0),
            ("2Gi", 2 * GI),
            ("100Gi", 100 * GI),
        ];
        for &(input, want) in cases {
            assert_eq!(parse_quantity(input), Ok(want), "{input}");
        }
    }

    #[test]
    fn quantity_syntax() {
        let cases: &[(&str, u64)] = &[
            ("0", 0),
            ("7", 7),
            ("+1k", 1_000),
            ("1k", 1_000),
            ("1M", 1_000_000),
            ("1G", 1_000_000_000),
            ("1T", 1_000_000_000_000),
            ("1P", 1_000_000_000_000_000),
            ("1E", 1_000_000_000_000_000_000),
            ("1Ki", KI),
            ("0.5Ki", 512),
            ("1536Ki", 1536 * KI),
            ("1Ti", 1 << 40),
            ("1Pi", 1 << 50),
            ("1Ei", 1 << 60),
            ("15Ei", 15 << 60),
            ("000001Ki", KI),
            ("1.50Gi", 1_610_612_736),
            // Fractions round up, as Quantity.Value() does.
            ("0.1", 1),
            (".5", 1),
            ("5.", 5),
            ("1m", 1),
            ("1500m", 2),
            ("2000m", 2),
            ("1u", 1),
            ("1n", 1),
            ("0m", 0),
            ("1.0000000000000000000000000000000000000000001", 2),
            ("0.000000000000000000000000000000000000001Ei", 1),
            ("1.1Ki", 1127),
            // Decimal exponents.
            ("1e3", 1_000),
            ("1E3", 1_000),
            ("1e+3", 1_000),
            ("12e-1", 2),
            ("10e-1", 1),
            ("1e-99999999999999999999999", 1),
            ("0e99999999999999999999999", 0),
            ("1e19", 10_000_000_000_000_000_000),
            // The u64 boundary.
            ("18446744073709551615", u64::MAX),
            ("18446744073709551614.1", u64::MAX),
            (
                "15.999999999999999999132638262011596452794037759304046630859375Ei",
                u64::MAX,
            ),
            (
                "15.999999999999999999132638262011596452794037759304046630859374Ei",
                u64::MAX,
            ),
        ];
        for &(input, want) in cases {
            assert_eq!(parse_quantity(input), Ok(want), "{input}");
        }
    }

    #[test]
    fn quantity_errors() {
        use QuantityError::{Empty, Malformed, Negative, TooLarge};
        let malformed = |s: &str| Malformed { input: s.into() };
        let cases: Vec<(&str, QuantityError)> = vec![
            ("", Empty),
            ("abc", malformed("abc")),
            ("10Mb", malformed("10Mb")),
            ("1 Gi", malformed("1 Gi")),
            (" 1Gi", malformed(" 1Gi")),
            ("1Gi ", malformed("1Gi ")),
            (".", malformed(".")),
            ("+", malformed("+")),
            ("-", malformed("-")),
            ("--1", malformed("--1")),
            ("+-1", malformed("+-1")),
            ("1K", malformed("1K")),
            ("1ki", malformed("1ki")),
            ("1e", malformed("1e")),
            ("1e1.5", malformed("1e1.5")),
            ("1e3Ki", malformed("1e3Ki")),
            ("1.2.3", malformed("1.2.3")),
            ("Gi", malformed("Gi")),
            (
                "-1Gi",
                Negative {
                    input: "-1Gi".into(),
                },
            ),
            ("-0", Negative { input: "-0".into() }),
            (
                "99999999999Ei",
                TooLarge {
                    input: "99999999999Ei".into(),
                },
            ),
            (
                "16Ei",
                TooLarge {
                    input: "16Ei".into(),
                },
            ),
            (
                "18446744073709551616",
                TooLarge {
                    input: "18446744073709551616".into(),
                },
            ),
            (
                "18446744073709551615.1",
                TooLarge {
                    input: "18446744073709551615.1".into(),
                },
            ),
            (
                "15.999999999999999999132638262011596452794037759304046630859376Ei",
                TooLarge {
                    input: "15.999999999999999999132638262011596452794037759304046630859376Ei"
                        .into(),
                },
            ),
            (
                "1e20",
                TooLarge {
                    input: "1e20".into(),
                },
            ),
        ];
        for (input, want) in cases {
            let got = parse_quantity(input);
            assert_eq!(got, Err(want), "{input}");
            assert_names_input(got.unwrap_err(), input);
        }
    }

    #[test]
    fn percentages() {
        // "10%", "5%" and "15%" are the kubelet docs' examples.
        let cases: &[(&str, f64)] = &[
            ("10%", 10.0),
            ("5%", 5.0),
            ("15%", 15.0),
            ("0.5%", 0.5),
            (".5%", 0.5),
            ("5.%", 5.0),
            ("+10%", 10.0),
            ("100%", 100.0),
            ("100.000%", 100.0),
            ("007%", 7.0),
            ("99.99%", 99.99),
        ];
        for &(input, want) in cases {
            assert_eq!(parse_percentage(input), Ok(want), "{input}");
        }
    }

    #[test]
    fn percentage_errors() {
        let cases = [
            "0%",
            "0.000%",
            "101%",
            "100.0001%",
            "1000%",
            "-5%",
            "x%",
            "%",
            "10",
            "10 %",
            " 10%",
            "10%%",
            "1e1%",
            "nan%",
            "inf%",
            ".%",
            "0.0000000000000000000000000000000000000000000000000000000000000000000000\
             00000000000000000000000000000000000000000000000000000000000000000000000\
             00000000000000000000000000000000000000000000000000000000000000000000000\
             00000000000000000000000000000000000000000000000000000000000000000000000\
             00000000000000000000000000000000000000000000000000000000000000000000001%",
        ];
        assert_eq!(parse_percentage(""), Err(QuantityError::Empty));
        for input in cases {
            let got = parse_percentage(input);
            assert_eq!(
                got,
                Err(QuantityError::Percentage {
                    input: input.into()
                }),
                "{input}"
            );
            assert_names_input(got.unwrap_err(), input);
        }
    }

    #[test]
    fn durations() {
        let s = Duration::from_secs;
        let ms = Duration::from_millis;
        let ns = Duration::from_nanos;
        // "1m30s" and "5m" are the kubelet docs' examples.
        let cases: &[(&str, Duration)] = &[
            ("1m30s", s(90)),
            ("5m", s(300)),
            ("300ms", ms(300)),
            ("1.5h", s(5400)),
            ("2h45m", s(9900)),
            ("0", Duration::ZERO),
            ("+0", Duration::ZERO),
            ("0s", Duration::ZERO),
            ("1h0m0s", s(3600)),
            ("10s", s(10)),
            (".5s", ms(500)),
            ("5.s", s(5)),
            ("1ns", ns(1)),
            ("1us", ns(1_000)),
            ("1µs", ns(1_000)),
            ("1μs", ns(1_000)),
            ("1.5µs", ns(1_500)),
            ("1s500ms", ms(1_500)),
            ("1.000000001s", ns(1_000_000_001)),
            // Sub-nanosecond fractions are truncated, as in Go.
            ("0.0000000019s", ns(1)),
            ("1.9ns", ns(1)),
            ("0.3333333333333333333333333h", ns(1_199_999_999_999)),
            ("2562047h47m16.854775807s", ns(i64::MAX as u64)),
        ];
        for &(input, want) in cases {
            assert_eq!(parse_duration(input), Ok(want), "{input}");
        }
    }

    #[test]
    fn duration_errors() {
        use QuantityError::{Empty, NegativeDuration, TooLarge};
        let bad = |s: &str| QuantityError::Duration { input: s.into() };
        let cases: Vec<(&str, QuantityError)> = vec![
            ("", Empty),
            ("1d", bad("1d")),
            ("1", bad("1")),
            ("s", bad("s")),
            (".s", bad(".s")),
            ("1s ", bad("1s ")),
            (" 1s", bad(" 1s")),
            ("1 s", bad("1 s")),
            ("1h-5m", bad("1h-5m")),
            ("1S", bad("1S")),
            ("1sec", bad("1sec")),
            ("+", bad("+")),
            ("00", bad("00")),
            ("--1s", bad("--1s")),
            (
                "-1s",
                NegativeDuration {
                    input: "-1s".into(),
                },
            ),
            ("-0", NegativeDuration { input: "-0".into() }),
            (
                "-1m30s",
                NegativeDuration {
                    input: "-1m30s".into(),
                },
            ),
            (
                "2562047h47m16.854775808s",
                TooLarge {
                    input: "2562047h47m16.854775808s".into(),
                },
            ),
            (
                "2562048h",
                TooLarge {
                    input: "2562048h".into(),
                },
            ),
            (
                "99999999999999999999999999999999999999999999h",
                TooLarge {
                    input: "99999999999999999999999999999999999999999999h".into(),
                },
            ),
        ];
        for (input, want) in cases {
            let got = parse_duration(input);
            assert_eq!(got, Err(want), "{input}");
            assert_names_input(got.unwrap_err(), input);
        }
    }

    #[test]
    fn formats_bytes() {
        let cases: &[(u64, &str)] = &[
            (0, "0"),
            (7, "7"),
            (1023, "1023"),
            (KI, "1Ki"),
            (1536, "1.5Ki"),
            (1025, "1.0Ki"),
            (100 * MI, "100Mi"),
            (1536 * KI, "1536Ki"),
            (GI, "1Gi"),
            (1_610_612_736, "1536Mi"),
            (1_610_612_737, "1.5Gi"),
            (GI - 1, "1.0Gi"),
            (100 * GI, "100Gi"),
            (1 << 60, "1Ei"),
            (u64::MAX, "16.0Ei"),
        ];
        for &(n, want) in cases {
            assert_eq!(format_bytes(n), want, "{n}");
        }
    }

    #[test]
    fn formats_durations() {
        let cases: &[(Duration, &str)] = &[
            (Duration::ZERO, "0s"),
            (Duration::from_secs(90), "1m30s"),
            (Duration::from_secs(300), "5m0s"),
            (Duration::from_millis(300), "300ms"),
            (Duration::from_secs(5400), "1h30m0s"),
            (Duration::from_secs(9900), "2h45m0s"),
            (Duration::from_millis(1500), "1.5s"),
            (Duration::from_micros(1500), "1.5ms"),
            (Duration::from_nanos(1500), "1.5µs"),
            (Duration::from_nanos(1), "1ns"),
            (Duration::from_nanos(1_000_000_001), "1.000000001s"),
            (Duration::from_secs(10 * 24 * 3600), "240h0m0s"),
        ];
        for &(d, want) in cases {
            assert_eq!(format_duration(d), want, "{d:?}");
        }
    }

    fn assert_names_input(err: QuantityError, input: &str) {
        if !input.is_empty() {
            let message = err.to_string();
            assert!(message.contains(input), "{message:?} should name {input:?}");
        }
    }

    /// The suffixes property (1) appends, with their multipliers.
    const SUFFIXES: [(&str, u64); 7] = [
        ("Ki", KI),
        ("Mi", MI),
        ("Gi", GI),
        ("k", 1_000),
        ("M", 1_000_000),
        ("G", 1_000_000_000),
        ("", 1),
    ];

    proptest! {
        #[test]
        fn suffixed_integers_scale_exactly(
            n in 0u64..=(1 << 40),
            (suffix, multiplier) in prop::sample::select(&SUFFIXES[..]),
        ) {
            let input = format!("{n}{suffix}");
            let want = n
                .checked_mul(multiplier)
                .ok_or(QuantityError::TooLarge { input: input.clone() });
            prop_assert_eq!(parse_quantity(&input), want);
        }

        #[test]
        fn fractions_round_up_exactly(
            int in 0u64..1_000_000,
            frac in 0u64..1_000,
            (suffix, multiplier) in prop::sample::select(&SUFFIXES[..]),
        ) {
            let input = format!("{int}.{frac:03}{suffix}");
            let thousandths = u128::from(int * 1_000 + frac) * u128::from(multiplier);
            let want = u64::try_from(thousandths.div_ceil(1_000)).unwrap();
            prop_assert_eq!(parse_quantity(&input), Ok(want));
        }

        #[test]
        fn milli_rounds_up(n in any::<u64>()) {
            prop_assert_eq!(parse_quantity(&format!("{n}m")), Ok(n.div_ceil(1_000)));
        }

        #[test]
        fn parsers_never_panic(s in ".*") {
            let _ = parse_quantity(&s);
            let _ = parse_percentage(&s);
            let _ = parse_duration(&s);
        }

        #[test]
        fn parsers_never_panic_on_near_misses(s in "[-+0-9.eEkKMGTPimnuhsµ% ]{0,24}") {
            let _ = parse_quantity(&s);
            let _ = parse_percentage(&s);
            let _ = parse_duration(&s);
        }

        #[test]
        fn durations_round_trip(ms in 0u64..=10 * 24 * 3600 * 1000) {
            let d = Duration::from_millis(ms);
            prop_assert_eq!(parse_duration(&format_duration(d)), Ok(d));
        }

        #[test]
        fn nanosecond_durations_round_trip(ns in 0..=GO_MAX_DURATION_NANOS) {
            let d = Duration::from_nanos(ns);
            prop_assert_eq!(parse_duration(&format_duration(d)), Ok(d));
        }

        #[test]
        fn exact_byte_formats_round_trip(
            n in prop_oneof![
                any::<u64>(),
                (0u64..1 << 20, 0u32..44).prop_map(|(m, shift)| m << shift),
            ],
        ) {
            let text = format_bytes(n);
            if !text.contains('.') {
                prop_assert_eq!(parse_quantity(&text), Ok(n));
            }
        }
    }
}
