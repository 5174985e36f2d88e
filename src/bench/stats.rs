//! The statistics of a run: nearest-rank percentiles of the latencies.

use std::time::Duration;

use serde::Serialize;

/// The nearest-rank percentile of `sorted` (ascending): the smallest sample
/// with at least `percent` % of the samples at or below it. Always one of
/// the samples (never interpolated), so p50 ≤ p95 ≤ p99 ≤ max holds by
/// construction. `None` when there are no samples.
pub(super) fn percentile(sorted: &[Duration], percent: u32) -> Option<Duration> {
    let n = sorted.len();
    if n == 0 {
        return None;
    }
    // rank = ⌈percent/100 · n⌉ in integers (no float rounding), at least 1.
    let rank = (percent as usize * n).div_ceil(100).clamp(1, n);
    Some(sorted[rank - 1])
}

/// Milliseconds, to the microsecond.
fn ms(duration: Duration) -> f64 {
    (duration.as_secs_f64() * 1_000_000.0).round() / 1000.0
}

/// The distribution of one latency, in milliseconds.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(super) struct Summary {
    pub(super) samples: usize,
    pub(super) min: f64,
    pub(super) p50: f64,
    pub(super) p95: f64,
    pub(super) p99: f64,
    pub(super) max: f64,
    pub(super) mean: f64,
}

impl Summary {
    /// One report line: p50, p95, min, max (ms) and the samples, or "no
    /// samples".
    pub(super) fn line(summary: &Option<Self>) -> String {
        summary.as_ref().map_or("no samples".to_string(), |s| {
            format!(
                "p50 {:.1} ms  p95 {:.1} ms  min {:.1} ms  max {:.1} ms  ({} samples)",
                s.p50, s.p95, s.min, s.max, s.samples
            )
        })
    }

    /// `None` when there is nothing to summarise.
    pub(super) fn of(mut samples: Vec<Duration>) -> Option<Self> {
        samples.sort_unstable();
        let first = *samples.first()?;
        let last = *samples.last()?;
        let at = |percent| percentile(&samples, percent).map_or(0.0, ms);
        let total: Duration = samples.iter().sum();
        let count = u32::try_from(samples.len()).unwrap_or(u32::MAX);
        Some(Self {
            samples: samples.len(),
            min: ms(first),
            p50: at(50),
            p95: at(95),
            p99: at(99),
            max: ms(last),
            mean: ms(total / count),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms_list(values: &[u64]) -> Vec<Duration> {
        values.iter().map(|v| Duration::from_millis(*v)).collect()
    }

    #[test]
    fn nearest_rank_picks_a_sample() {
        let sorted = ms_list(&(1..=100).collect::<Vec<_>>());
        assert_eq!(percentile(&sorted, 50), Some(Duration::from_millis(50)));
        assert_eq!(percentile(&sorted, 95), Some(Duration::from_millis(95)));
        assert_eq!(percentile(&sorted, 99), Some(Duration::from_millis(99)));
        assert_eq!(percentile(&sorted, 100), Some(Duration::from_millis(100)));
        // Small sets: the rank rounds up.
        let three = ms_list(&[10, 20, 30]);
        assert_eq!(percentile(&three, 50), Some(Duration::from_millis(20)));
        assert_eq!(percentile(&three, 95), Some(Duration::from_millis(30)));
        assert_eq!(
            percentile(&ms_list(&[7]), 50),
            Some(Duration::from_millis(7))
        );
        assert_eq!(
            percentile(&ms_list(&[1, 2]), 50),
            Some(Duration::from_millis(1))
        );
        assert_eq!(
            percentile(&ms_list(&[1, 2]), 51),
            Some(Duration::from_millis(2))
        );
        assert_eq!(
            percentile(&ms_list(&[5, 9]), 0),
            Some(Duration::from_millis(5))
        );
        assert_eq!(percentile(&[], 50), None);
    }

    #[test]
    fn integer_ranks_do_not_suffer_float_rounding() {
        // 7 % of 100 is rank 7 (a float 0.07 * 100 is 7.000000000000001).
        let sorted = ms_list(&(1..=100).collect::<Vec<_>>());
        assert_eq!(percentile(&sorted, 7), Some(Duration::from_millis(7)));
    }

    #[test]
    fn a_summary_is_ordered_and_in_milliseconds() {
        let samples = vec![
            Duration::from_micros(3_500),
            Duration::from_micros(1_250),
            Duration::from_micros(2_000),
            Duration::from_micros(10_000),
        ];
        let summary = Summary::of(samples).unwrap();
        assert_eq!(
            summary,
            Summary {
                samples: 4,
                min: 1.25,
                p50: 2.0,
                p95: 10.0,
                p99: 10.0,
                max: 10.0,
                mean: 4.188,
            }
        );
        assert_eq!(Summary::of(Vec::new()), None);
    }

    proptest::proptest! {
        #[test]
        fn percentiles_are_ordered(values in proptest::collection::vec(0u64..1_000_000, 1..300)) {
            let summary = Summary::of(values.iter().map(|v| Duration::from_micros(*v)).collect()).unwrap();
            proptest::prop_assert!(summary.min <= summary.p50);
            proptest::prop_assert!(summary.p50 <= summary.p95);
            proptest::prop_assert!(summary.p95 <= summary.p99);
            proptest::prop_assert!(summary.p99 <= summary.max);
            proptest::prop_assert!(summary.min <= summary.mean && summary.mean <= summary.max);
            proptest::prop_assert_eq!(summary.samples, values.len());
        }
    }
}
