//! The machine this process runs on, as Linux's `/proc` describes it:
//! plain figures for whoever reports on the machine (Judge0's
//! `/system_info` shows the API's; the warm pool keeps a reserve of the
//! memory available). Knows `/proc`'s formats, nothing of
//! HTTP, Docker or Redis.

/// A field of `/proc/meminfo` (such as `MemAvailable`), in bytes.
pub fn meminfo_bytes(meminfo: &str, name: &str) -> Option<u64> {
    meminfo.lines().find_map(|line| {
        let (key, rest) = line.split_once(':')?;
        if key.trim() != name {
            return None;
        }
        let mut words = rest.split_whitespace();
        let value: u64 = words.next()?.parse().ok()?;
        match words.next() {
            Some("kB") => value.checked_mul(1024),
            None => Some(value),
            Some(_) => None,
        }
    })
}

/// This machine's `/proc/meminfo` field `name`, in bytes; `None` when it
/// cannot be read.
pub fn machine_bytes(name: &str) -> Option<u64> {
    meminfo_bytes(&std::fs::read_to_string("/proc/meminfo").ok()?, name)
}

/// The machine's memory and swap, in bytes (`None`: not in `/proc/meminfo`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemoryTotals {
    pub memory_bytes: Option<u64>,
    pub swap_bytes: Option<u64>,
}

impl MemoryTotals {
    /// The totals in the text of a `/proc/meminfo`.
    pub fn parse(meminfo: &str) -> Self {
        Self {
            memory_bytes: meminfo_bytes(meminfo, "MemTotal"),
            swap_bytes: meminfo_bytes(meminfo, "SwapTotal"),
        }
    }

    /// This machine's totals; none when `/proc/meminfo` cannot be read.
    pub fn read() -> Self {
        Self::parse(&std::fs::read_to_string("/proc/meminfo").unwrap_or_default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MEMINFO: &str = "MemTotal:       24683784 kB\nMemFree:        15319132 kB\nMemAvailable:   23578092 kB\nHugePages_Total:       0\n";

    #[test]
    fn reads_a_field_in_bytes() {
        assert_eq!(
            meminfo_bytes(MEMINFO, "MemAvailable"),
            Some(23_578_092 * 1024)
        );
        assert_eq!(meminfo_bytes(MEMINFO, "MemTotal"), Some(24_683_784 * 1024));
        // A count without a unit is taken as it is.
        assert_eq!(meminfo_bytes(MEMINFO, "HugePages_Total"), Some(0));
    }

    #[test]
    fn a_missing_or_malformed_field_is_none() {
        assert_eq!(meminfo_bytes(MEMINFO, "SwapTotal"), None);
        assert_eq!(meminfo_bytes(MEMINFO, "Mem"), None);
        assert_eq!(
            meminfo_bytes("MemAvailable: lots kB\n", "MemAvailable"),
            None
        );
        assert_eq!(meminfo_bytes("MemAvailable: 12 MB\n", "MemAvailable"), None);
        assert_eq!(meminfo_bytes("", "MemAvailable"), None);
    }

    #[test]
    fn the_totals_are_memory_and_swap() {
        assert_eq!(
            MemoryTotals::parse(MEMINFO),
            MemoryTotals {
                memory_bytes: Some(24_683_784 * 1024),
                swap_bytes: None,
            }
        );
        assert_eq!(MemoryTotals::parse(""), MemoryTotals::default());
    }
}
