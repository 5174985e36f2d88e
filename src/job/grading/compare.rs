//! The built-in comparisons of a test's output with its expected output.
//!
//! | mode     | equal when                                                        |
//! |----------|-------------------------------------------------------------------|
//! | `exact`  | the bytes are the same                                            |
//! | `trim`   | the same after removing trailing whitespace (spaces, tabs, `\r`) from each line and the blank lines at the end (the default; Judge0's comparison) |
//! | `tokens` | the same whitespace-separated tokens, in order                    |
//! | `float`  | as `tokens`, except that two tokens that are both numbers are equal when they differ by at most `abs`, or by at most `rel` times the expected one |
//!
//! A difference is reported as the first line (for `exact` and `trim`) or
//! the first token (for `tokens` and `float`) that differs, both sides cut
//! to [`PREVIEW_CHARS`]; a side that has ended is `None`.

use serde::{Deserialize, Serialize};

/// How much of a differing line or token is shown, in characters.
pub const PREVIEW_CHARS: usize = 80;
/// `float`'s tolerances when none is given.
pub const DEFAULT_ABS: f64 = 1e-6;
pub const DEFAULT_REL: f64 = 1e-6;

/// A built-in comparison.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Check {
    Exact,
    Trim,
    Tokens,
    Float { abs: f64, rel: f64 },
}

impl Check {
    /// `float` with the given tolerances, the defaults for those not given.
    pub fn float(abs: Option<f64>, rel: Option<f64>) -> Self {
        Check::Float {
            abs: abs.unwrap_or(DEFAULT_ABS),
            rel: rel.unwrap_or(DEFAULT_REL),
        }
    }

    pub fn name(&self) -> &'static str {
        match self {
            Check::Exact => "exact",
            Check::Trim => "trim",
            Check::Tokens => "tokens",
            Check::Float { .. } => "float",
        }
    }

    /// `None` when `got` is accepted as `expected`, else the first
    /// difference.
    pub fn compare(&self, expected: &[u8], got: &[u8]) -> Option<Difference> {
        match self {
            Check::Exact => {
                if expected == got {
                    None
                } else {
                    first_line_difference(split_lines(expected), split_lines(got))
                        .or_else(|| Some(ending_difference(expected, got)))
                }
            }
            Check::Trim => first_line_difference(trimmed_lines(expected), trimmed_lines(got)),
            Check::Tokens => first_token_difference(expected, got, |a, b| a == b),
            Check::Float { abs, rel } => {
                first_token_difference(expected, got, |a, b| close(a, b, *abs, *rel))
            }
        }
    }
}

/// Where a wrong answer first differs from the expected output.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Difference {
    /// 1-based line of the expected output (of the output for `tokens`).
    pub line: usize,
    /// 1-based token, for `tokens` and `float`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<usize>,
    /// The expected line or token, cut short; `None` past the expected end.
    pub expected: Option<String>,
    /// The program's line or token, cut short; `None` past its end.
    pub got: Option<String>,
}

/// `text` lossily as UTF-8, cut to `chars` characters (with `…`).
pub fn preview(bytes: &[u8], chars: usize) -> String {
    let text = String::from_utf8_lossy(bytes);
    let mut cut: String = text.chars().take(chars).collect();
    if text.chars().nth(chars).is_some() {
        cut.push('…');
    }
    cut
}

/// Lines split on `\n`, without a last empty line after a final newline.
fn split_lines(bytes: &[u8]) -> Vec<&[u8]> {
    let mut lines: Vec<&[u8]> = bytes.split(|b| *b == b'\n').collect();
    if lines.last().is_some_and(|l| l.is_empty()) {
        lines.pop();
    }
    lines
}

fn is_space(byte: &u8) -> bool {
    matches!(byte, b' ' | b'\t' | b'\r' | b'\x0b' | b'\x0c')
}

/// Lines without trailing whitespace, and without the blank lines at the end.
fn trimmed_lines(bytes: &[u8]) -> Vec<&[u8]> {
    let mut lines: Vec<&[u8]> = bytes
        .split(|b| *b == b'\n')
        .map(|line| {
            let end = line.iter().rposition(|b| !is_space(b)).map_or(0, |i| i + 1);
            &line[..end]
        })
        .collect();
    while lines.last().is_some_and(|l| l.is_empty()) {
        lines.pop();
    }
    lines
}

fn first_line_difference(expected: Vec<&[u8]>, got: Vec<&[u8]>) -> Option<Difference> {
    let longest = expected.len().max(got.len());
    (0..longest).find_map(|index| {
        let (e, g) = (expected.get(index), got.get(index));
        (e != g).then(|| Difference {
            line: index + 1,
            token: None,
            expected: e.map(|l| preview(l, PREVIEW_CHARS)),
            got: g.map(|l| preview(l, PREVIEW_CHARS)),
        })
    })
}

/// `exact` on outputs whose lines are all equal: they differ in the final
/// newline only.
fn ending_difference(expected: &[u8], got: &[u8]) -> Difference {
    let line = split_lines(expected).len().max(1);
    let ending = |bytes: &[u8]| {
        if bytes.ends_with(b"\n") {
            "(a final newline)".to_string()
        } else {
            "(no final newline)".to_string()
        }
    };
    Difference {
        line,
        token: None,
        expected: Some(ending(expected)),
        got: Some(ending(got)),
    }
}

fn first_token_difference(
    expected: &[u8],
    got: &[u8],
    equal: impl Fn(&[u8], &[u8]) -> bool,
) -> Option<Difference> {
    let tokens = |bytes: &[u8]| -> Vec<(usize, Vec<u8>)> {
        let mut line = 1;
        let mut out = Vec::new();
        let mut current: Vec<u8> = Vec::new();
        for byte in bytes {
            if byte.is_ascii_whitespace() {
                if !current.is_empty() {
                    out.push((line, std::mem::take(&mut current)));
                }
                if *byte == b'\n' {
                    line += 1;
                }
            } else {
                current.push(*byte);
            }
        }
        if !current.is_empty() {
            out.push((line, current));
        }
        out
    };
    let (expected, got) = (tokens(expected), tokens(got));
    let longest = expected.len().max(got.len());
    (0..longest).find_map(|index| {
        let (e, g) = (expected.get(index), got.get(index));
        let same = matches!((e, g), (Some(e), Some(g)) if equal(&e.1, &g.1));
        (!same).then(|| Difference {
            line: g.or(e).map_or(1, |t| t.0),
            token: Some(index + 1),
            expected: e.map(|t| preview(&t.1, PREVIEW_CHARS)),
            got: g.map(|t| preview(&t.1, PREVIEW_CHARS)),
        })
    })
}

/// Two tokens under `float`: numbers within the tolerance, anything else
/// the same text.
fn close(expected: &[u8], got: &[u8], abs: f64, rel: f64) -> bool {
    if expected == got {
        return true;
    }
    let number = |bytes: &[u8]| -> Option<f64> {
        std::str::from_utf8(bytes)
            .ok()?
            .parse::<f64>()
            .ok()
            .filter(|v| v.is_finite())
    };
    match (number(expected), number(got)) {
        (Some(e), Some(g)) => {
            let difference = (e - g).abs();
            difference <= abs || difference <= rel * e.abs()
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn accepted(check: Check, expected: &str, got: &str) -> bool {
        check.compare(expected.as_bytes(), got.as_bytes()).is_none()
    }

    #[test]
    fn exact_takes_the_bytes_as_they_are() {
        assert!(accepted(Check::Exact, "1 2\n", "1 2\n"));
        assert!(!accepted(Check::Exact, "1 2\n", "1 2 \n"));
        assert!(!accepted(Check::Exact, "1 2\n", "1 2"));
        assert_eq!(
            Check::Exact.compare(b"1 2\n", b"1 2"),
            Some(Difference {
                line: 1,
                token: None,
                expected: Some("(a final newline)".into()),
                got: Some("(no final newline)".into()),
            })
        );
        assert_eq!(
            Check::Exact
                .compare(b"a\nb\nc\n", b"a\nB\nc\n")
                .unwrap()
                .line,
            2
        );
    }

    #[test]
    fn trim_forgives_trailing_spaces_and_final_blank_lines_only() {
        let check = Check::Trim;
        assert!(accepted(check, "1 2\n3\n", "1 2   \n3\t\r\n\n\n"));
        assert!(accepted(check, "1 2\n3\n", "1 2\n3"));
        assert!(accepted(check, "", "\n \n"));
        // Leading spaces, inner spaces and blank lines in the middle count.
        assert!(!accepted(check, "1 2\n", " 1 2\n"));
        assert!(!accepted(check, "1 2\n", "1  2\n"));
        assert!(!accepted(check, "a\nb\n", "a\n\nb\n"));
        assert_eq!(
            check.compare(b"a\nb\n", b"a\n"),
            Some(Difference {
                line: 2,
                token: None,
                expected: Some("b".into()),
                got: None,
            })
        );
    }

    #[test]
    fn tokens_ignore_how_whitespace_is_laid_out() {
        let check = Check::Tokens;
        assert!(accepted(check, "1 2\n3\n", "1\n2 \t 3"));
        assert!(accepted(check, "1 2 3", "  1 2 3  \n\n"));
        assert!(!accepted(check, "1 2 3", "1 2"));
        assert!(!accepted(check, "1.0", "1"));
        assert_eq!(
            check.compare(b"1 2\n3 4\n", b"1 2\n3 5\n"),
            Some(Difference {
                line: 2,
                token: Some(4),
                expected: Some("4".into()),
                got: Some("5".into()),
            })
        );
    }

    #[test]
    fn float_accepts_numbers_within_the_tolerance_and_nothing_else() {
        let check = Check::float(None, None);
        assert!(accepted(check, "0.3333333", "0.33333335"));
        assert!(accepted(check, "1000000", "1000000.9"), "relative 1e-6");
        assert!(accepted(check, "2.5 abc", "2.5000000001 abc"));
        assert!(!accepted(check, "0.3333333", "0.3333353"));
        assert!(!accepted(check, "abc", "abd"));
        assert!(!accepted(check, "1", "nan"));
        assert!(!accepted(check, "1 2", "1"));
        let loose = Check::float(Some(0.01), Some(0.0));
        assert!(accepted(loose, "3.14159", "3.14"));
        assert!(!accepted(loose, "3.14159", "3.13"));
        // A 1e-7 difference: within float's default tolerance, never
        // equal as tokens or exactly.
        assert!(accepted(check, "2.0000000\n", "2.0000001\n"));
        assert!(!accepted(Check::Tokens, "2.0000000\n", "2.0000001\n"));
        assert!(!accepted(Check::Exact, "2.0000000\n", "2.0000001\n"));
        let strict = Check::float(Some(0.0), Some(0.0));
        assert!(
            accepted(strict, "1e-7", "0.0000001"),
            "the same number, written otherwise"
        );
        assert!(!accepted(strict, "1e-7", "1.0000001e-7"));
    }

    #[test]
    fn previews_are_cut_to_whole_characters() {
        assert_eq!(preview("é".repeat(100).as_bytes(), 3), "ééé…");
        assert_eq!(preview(b"short", 80), "short");
        assert_eq!(preview(&[0xff, b'a'], 80), "\u{fffd}a");
    }
}
