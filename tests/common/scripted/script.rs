//! The script language of the scripted engine: a job's program read as
//! its steps (see the table in [`super`]'s documentation).

use std::time::Duration;

#[derive(Debug, Clone, PartialEq)]
pub(super) enum Step {
    Out {
        text: Vec<u8>,
        stderr: bool,
    },
    Flood(u64),
    Cat(String),
    Sleep(Duration),
    ReadLine {
        upper: bool,
        prefix: Vec<u8>,
    },
    Read,
    Echo {
        upper: bool,
    },
    IgnoreInterrupt,
    TrapInterrupt(Vec<u8>),
    CatchInterrupt(Vec<u8>),
    Repeat {
        times: Option<u64>,
        body: Vec<Step>,
    },
    Exit(i32),
    Die(String),
    Oom,
    CpuLimit,
    Usage {
        cpu_ms: u64,
        memory: u64,
    },
    Crash,
    Stuck,
    CompileError(Vec<u8>),
    /// A file of the workspace: its bytes, or `None` for a symbolic link.
    File {
        name: String,
        content: Option<Vec<u8>>,
    },
}

/// A script that could not be read: the line and why.
#[derive(Debug)]
pub(super) struct ScriptError(pub(super) usize, pub(super) String);

pub(super) fn parse(source: &str) -> Result<Vec<Step>, ScriptError> {
    let lines: Vec<(usize, &str)> = source
        .lines()
        .enumerate()
        .map(|(n, line)| (n + 1, line.trim()))
        .filter(|(_, line)| !line.is_empty() && !line.starts_with('#'))
        .collect();
    let mut at = 0;
    let steps = parse_block(&lines, &mut at, false)?;
    Ok(steps)
}

fn parse_block(
    lines: &[(usize, &str)],
    at: &mut usize,
    nested: bool,
) -> Result<Vec<Step>, ScriptError> {
    let mut steps = Vec::new();
    while *at < lines.len() {
        let (number, line) = lines[*at];
        *at += 1;
        let (word, rest) = line.split_once(' ').unwrap_or((line, ""));
        let error = |message: &str| ScriptError(number, format!("{message}: {line:?}"));
        let number_arg = || {
            rest.trim()
                .parse::<u64>()
                .map_err(|_| error("needs a number"))
        };
        let step = match word {
            "end" if nested => return Ok(steps),
            "print" | "eprint" => {
                let mut text = unescape(rest);
                text.push(b'\n');
                Step::Out {
                    text,
                    stderr: word == "eprint",
                }
            }
            "write" | "ewrite" => Step::Out {
                text: unescape(rest),
                stderr: word == "ewrite",
            },
            "flood" => Step::Flood(number_arg()?),
            "cat" => Step::Cat(rest.trim().to_string()),
            "sleep" => Step::Sleep(Duration::from_millis(number_arg()?)),
            "readline" => {
                let (upper, prefix) = match rest.strip_prefix("upper") {
                    Some(after) => (true, after.strip_prefix(' ').unwrap_or(after)),
                    None => (false, rest),
                };
                Step::ReadLine {
                    upper,
                    prefix: unescape(prefix),
                }
            }
            "read" => Step::Read,
            "echo" if rest.is_empty() || rest == "upper" => Step::Echo {
                upper: rest == "upper",
            },
            "ignore" if rest == "SIGINT" => Step::IgnoreInterrupt,
            "trap" if rest.starts_with("SIGINT ") => {
                let mut text = unescape(&rest["SIGINT ".len()..]);
                text.push(b'\n');
                Step::TrapInterrupt(text)
            }
            "catch" if rest.starts_with("SIGINT ") => {
                let mut text = unescape(&rest["SIGINT ".len()..]);
                text.push(b'\n');
                Step::CatchInterrupt(text)
            }
            "repeat" => Step::Repeat {
                times: Some(number_arg()?),
                body: parse_block(lines, at, true)?,
            },
            "forever" => Step::Repeat {
                times: None,
                body: parse_block(lines, at, true)?,
            },
            "exit" => Step::Exit(rest.trim().parse().map_err(|_| error("needs a code"))?),
            "die" if rest.starts_with("SIG") => Step::Die(rest.to_string()),
            "oom" => Step::Oom,
            "cpu-limit" => Step::CpuLimit,
            "usage" => {
                let mut figures = rest.split_whitespace().map(str::parse::<u64>);
                match (figures.next(), figures.next()) {
                    (Some(Ok(cpu_ms)), Some(Ok(memory))) => Step::Usage { cpu_ms, memory },
                    _ => return Err(error("needs CPU_MS MEMORY_BYTES")),
                }
            }
            "file" | "file-bytes" | "link" => {
                let (name, arg) = rest.split_once(' ').unwrap_or((rest, ""));
                let content = match word {
                    "link" => None,
                    "file" => Some(unescape(arg)),
                    _ => {
                        let size: u32 =
                            arg.trim().parse().map_err(|_| error("needs NAME BYTES"))?;
                        Some((0..size).map(|i| (i % 251) as u8).collect())
                    }
                };
                Step::File {
                    name: name.to_string(),
                    content,
                }
            }
            "crash" => Step::Crash,
            "stuck" => Step::Stuck,
            "compile-error" => Step::CompileError(unescape(rest)),
            _ => return Err(error("unknown step")),
        };
        steps.push(step);
    }
    if nested {
        return Err(ScriptError(
            lines.last().map_or(0, |l| l.0),
            "a block has no `end`".to_string(),
        ));
    }
    Ok(steps)
}

fn unescape(text: &str) -> Vec<u8> {
    let mut out = Vec::new();
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '\\' {
            let mut buffer = [0; 4];
            out.extend_from_slice(c.encode_utf8(&mut buffer).as_bytes());
            continue;
        }
        match chars.next() {
            Some('n') => out.push(b'\n'),
            Some('t') => out.push(b'\t'),
            Some('\\') => out.push(b'\\'),
            Some('x') => {
                let hex: String = chars.by_ref().take(2).collect();
                out.push(u8::from_str_radix(&hex, 16).unwrap_or(b'?'));
            }
            Some(other) => {
                out.push(b'\\');
                let mut buffer = [0; 4];
                out.extend_from_slice(other.encode_utf8(&mut buffer).as_bytes());
            }
            None => out.push(b'\\'),
        }
    }
    out
}

/// `text` with `{i}` replaced by the iteration.
pub(super) fn with_iteration(text: &[u8], i: Option<u64>) -> Vec<u8> {
    let Some(i) = i else {
        return text.to_vec();
    };
    let mut out = Vec::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.windows(3).position(|w| w == b"{i}") {
        out.extend_from_slice(&rest[..at]);
        out.extend_from_slice(i.to_string().as_bytes());
        rest = &rest[at + 3..];
    }
    out.extend_from_slice(rest);
    out
}
