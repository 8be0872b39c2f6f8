//! Exact decimal numbers for timestamps: JSON numbers kept as digits and a power of ten, so
//! microsecond and millisecond timestamps convert to nanoseconds without floating-point error.

/// A JSON number kept exactly as `mantissa × 10^exponent` (sign separate).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Decimal {
    /// True for a negative number.
    pub negative: bool,
    /// The significant digits (at most 38 are kept; further digits only shift the exponent).
    pub mantissa: u128,
    /// Power of ten the mantissa is scaled by.
    pub exponent: i32,
}

impl Decimal {
    /// Parses a JSON number (also accepted inside strings, as some producers quote numbers).
    pub fn parse(text: &[u8]) -> Option<Decimal> {
        let mut i = 0;
        let mut d = Decimal::default();
        if text.first() == Some(&b'-') {
            d.negative = true;
            i = 1;
        }
        let mut digits = 0usize;
        let push = |d: &mut Decimal, b: u8, fraction: bool| {
            if d.mantissa < 10u128.pow(37) {
                d.mantissa = d.mantissa * 10 + u128::from(b - b'0');
                if fraction {
                    d.exponent -= 1;
                }
            } else if !fraction {
                d.exponent += 1;
            }
        };
        while let Some(&b) = text.get(i).filter(|b| b.is_ascii_digit()) {
            push(&mut d, b, false);
            digits += 1;
            i += 1;
        }
        if text.get(i) == Some(&b'.') {
            i += 1;
            let start = i;
            while let Some(&b) = text.get(i).filter(|b| b.is_ascii_digit()) {
                push(&mut d, b, true);
                i += 1;
            }
            if i == start {
                return None;
            }
            digits += i - start;
        }
        if digits == 0 {
            return None;
        }
        if matches!(text.get(i), Some(b'e' | b'E')) {
            i += 1;
            let negative = match text.get(i) {
                Some(b'-') => {
                    i += 1;
                    true
                }
                Some(b'+') => {
                    i += 1;
                    false
                }
                _ => false,
            };
            let start = i;
            let mut e: i32 = 0;
            while let Some(&b) = text.get(i).filter(|b| b.is_ascii_digit()) {
                e = e.saturating_mul(10).saturating_add(i32::from(b - b'0'));
                i += 1;
            }
            if i == start {
                return None;
            }
            d.exponent = d.exponent.saturating_add(if negative { -e } else { e });
        }
        (i == text.len()).then_some(d)
    }

    /// The value times `10^scale`, rounded half away from zero; `None` when it does not fit an `i64`.
    pub fn scaled_i64(self, scale: i32) -> Option<i64> {
        let exp = self.exponent.saturating_add(scale);
        let magnitude: u128 = if self.mantissa == 0 {
            0
        } else if exp >= 0 {
            let factor = 10u128.checked_pow(u32::try_from(exp).ok()?)?;
            self.mantissa.checked_mul(factor)?
        } else if exp < -38 {
            0
        } else {
            let factor = 10u128.pow(exp.unsigned_abs());
            (self.mantissa + factor / 2) / factor
        };
        let magnitude = i64::try_from(magnitude).ok()?;
        Some(if self.negative { -magnitude } else { magnitude })
    }

    /// The value as an integer, if it is one that fits an `i64`.
    pub fn integer(self) -> Option<i64> {
        if self.exponent < 0 {
            let factor = 10u128.checked_pow(self.exponent.unsigned_abs())?;
            if !self.mantissa.is_multiple_of(factor) {
                return None;
            }
        }
        self.scaled_i64(0)
    }

    /// The value as an `f64` (approximate), for values where exactness does not matter.
    pub fn to_f64(self) -> f64 {
        let v = self.mantissa as f64 * 10f64.powi(self.exponent);
        if self.negative { -v } else { v }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimals_are_exact() {
        let d = Decimal::parse(b"11552125241.123").unwrap();
        assert_eq!(d.scaled_i64(3), Some(11_552_125_241_123));
        assert_eq!(Decimal::parse(b"1.5e2").unwrap().integer(), Some(150));
        assert_eq!(Decimal::parse(b"-0.0005").unwrap().scaled_i64(3), Some(-1));
        assert_eq!(Decimal::parse(b"1e400").unwrap().scaled_i64(0), None);
        assert_eq!(
            Decimal::parse(b"99999999999999999999").unwrap().integer(),
            None
        );
        assert_eq!(Decimal::parse(b"1.5").unwrap().integer(), None);
        for bad in [&b""[..], b"-", b"1.", b"1e", b"1x", b"--1"] {
            assert!(Decimal::parse(bad).is_none(), "{bad:?}");
        }
    }
}
