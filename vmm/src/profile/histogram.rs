//! Log-linear latency histogram over TSC cycles.
//!
//! Bucketing is HDR-style: values `0..4` get one bucket each; every binary
//! range `[2^k, 2^(k+1))` for `k >= 2` is split into [`SUB_BUCKETS`] equal
//! sub-buckets. The relative error of a bucket is therefore at most 25%.
//! Values at or above `2^(MAX_EXPONENT + 1)` land in the last bucket.
//!
//! [`Histogram`] is written by exactly one thread (the owning vCPU) with
//! single-writer relaxed atomics (`load` + `store`, no locked instruction)
//! and may be read by any thread at any time through [`Histogram::snapshot`].

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use serde::{Deserialize, Serialize};

/// log2 of the number of sub-buckets per power-of-two range.
const SUB_BUCKET_BITS: u32 = 2;
/// Number of sub-buckets each power-of-two range is split into.
pub const SUB_BUCKETS: usize = 1 << SUB_BUCKET_BITS;
/// Largest exponent `k` whose range `[2^k, 2^(k+1))` is bucketed exactly.
pub const MAX_EXPONENT: u32 = 40;
/// Total number of buckets: the linear head plus `SUB_BUCKETS` per exponent.
pub const BUCKET_COUNT: usize =
    SUB_BUCKETS + (MAX_EXPONENT as usize + 1 - SUB_BUCKET_BITS as usize) * SUB_BUCKETS;

/// Index of the bucket that `value` (cycles) falls into.
#[inline]
pub fn bucket_index(value: u64) -> usize {
    if value < SUB_BUCKETS as u64 {
        return value as usize;
    }
    let exponent = 63 - value.leading_zeros();
    if exponent > MAX_EXPONENT {
        return BUCKET_COUNT - 1;
    }
    let shift = exponent - SUB_BUCKET_BITS;
    let sub_bucket = ((value >> shift) as usize) & (SUB_BUCKETS - 1);
    SUB_BUCKETS + (exponent - SUB_BUCKET_BITS) as usize * SUB_BUCKETS + sub_bucket
}

/// Smallest value that falls into bucket `index`.
pub fn bucket_lower_bound(index: usize) -> u64 {
    if index < SUB_BUCKETS {
        return index as u64;
    }
    let range = (index - SUB_BUCKETS) / SUB_BUCKETS;
    let sub_bucket = ((index - SUB_BUCKETS) % SUB_BUCKETS) as u64;
    (SUB_BUCKETS as u64 + sub_bucket) << range
}

/// Largest value that falls into bucket `index` (`u64::MAX` for the last one).
pub fn bucket_upper_bound(index: usize) -> u64 {
    if index + 1 >= BUCKET_COUNT {
        return u64::MAX;
    }
    bucket_lower_bound(index + 1) - 1
}

/// Single-writer atomic latency histogram (see the module documentation).
pub struct Histogram {
    buckets: [AtomicU64; BUCKET_COUNT],
    /// The smallest value, bit-inverted: an empty histogram is all zero bytes, so tables of
    /// them can live in untouched zero pages until a vCPU records into them.
    min_inverted: AtomicU64,
    max: AtomicU64,
}

impl Default for Histogram {
    fn default() -> Self {
        Self::new()
    }
}

impl Histogram {
    /// An empty histogram.
    pub const fn new() -> Self {
        Self {
            buckets: [const { AtomicU64::new(0) }; BUCKET_COUNT],
            min_inverted: AtomicU64::new(0),
            max: AtomicU64::new(0),
        }
    }

    /// Records one value. Must only be called by the owning (single) writer.
    #[inline]
    pub fn record(&self, value: u64) {
        let bucket = &self.buckets[bucket_index(value)];
        bucket.store(bucket.load(Relaxed) + 1, Relaxed);
        if value < !self.min_inverted.load(Relaxed) {
            self.min_inverted.store(!value, Relaxed);
        }
        if value > self.max.load(Relaxed) {
            self.max.store(value, Relaxed);
        }
    }

    /// Copies the current contents; safe to call from any thread.
    pub fn snapshot(&self) -> HistogramSnapshot {
        let buckets: Vec<u64> = self.buckets.iter().map(|b| b.load(Relaxed)).collect();
        let empty = buckets.iter().all(|&count| count == 0);
        HistogramSnapshot {
            buckets,
            min: if empty {
                0
            } else {
                !self.min_inverted.load(Relaxed)
            },
            max: if empty { 0 } else { self.max.load(Relaxed) },
        }
    }
}

/// Plain-data copy of a [`Histogram`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HistogramSnapshot {
    /// Sample count per bucket, `BUCKET_COUNT` entries.
    pub buckets: Vec<u64>,
    /// Smallest recorded value (0 when empty).
    pub min: u64,
    /// Largest recorded value (0 when empty).
    pub max: u64,
}

impl Default for HistogramSnapshot {
    fn default() -> Self {
        Self {
            buckets: vec![0; BUCKET_COUNT],
            min: 0,
            max: 0,
        }
    }
}

impl HistogramSnapshot {
    /// Total number of samples.
    pub fn count(&self) -> u64 {
        self.buckets.iter().sum()
    }

    /// Value at percentile `p` (0..=100): the upper bound of the bucket that
    /// holds the `ceil(p% * count)`-th sample, clamped to `[min, max]`.
    /// Returns 0 when empty.
    pub fn percentile(&self, p: f64) -> u64 {
        let count = self.count();
        if count == 0 {
            return 0;
        }
        let rank = ((p.clamp(0.0, 100.0) / 100.0) * count as f64).ceil() as u64;
        let rank = rank.clamp(1, count);
        let mut seen = 0u64;
        for (index, &bucket_count) in self.buckets.iter().enumerate() {
            seen += bucket_count;
            if seen >= rank {
                return bucket_upper_bound(index).clamp(self.min, self.max.max(self.min));
            }
        }
        self.max
    }

    /// Adds `other`'s samples into `self`.
    pub fn merge(&mut self, other: &HistogramSnapshot) {
        let (self_empty, other_empty) = (self.count() == 0, other.count() == 0);
        if self.buckets.len() < other.buckets.len() {
            self.buckets.resize(other.buckets.len(), 0);
        }
        for (mine, theirs) in self.buckets.iter_mut().zip(&other.buckets) {
            *mine += theirs;
        }
        if other_empty {
            return;
        }
        if self_empty {
            self.min = other.min;
            self.max = other.max;
        } else {
            self.min = self.min.min(other.min);
            self.max = self.max.max(other.max);
        }
    }

    /// Samples recorded since `earlier` (a snapshot of the same histogram).
    ///
    /// Bucket counts are exact. `min`/`max` are exact when the window set a
    /// new extreme; otherwise they are estimated from the lowest/highest
    /// non-empty bucket, clamped to the cumulative extremes.
    pub fn delta(&self, earlier: &HistogramSnapshot) -> HistogramSnapshot {
        let buckets: Vec<u64> = self
            .buckets
            .iter()
            .enumerate()
            .map(|(i, &now)| now.saturating_sub(earlier.buckets.get(i).copied().unwrap_or(0)))
            .collect();
        let first = buckets.iter().position(|&c| c != 0);
        let last = buckets.iter().rposition(|&c| c != 0);
        let (Some(first), Some(last)) = (first, last) else {
            return HistogramSnapshot::default();
        };
        let earlier_empty = earlier.count() == 0;
        let min = if earlier_empty || self.min < earlier.min {
            self.min
        } else {
            bucket_lower_bound(first).max(self.min)
        };
        let max = if earlier_empty || self.max > earlier.max {
            self.max
        } else {
            bucket_upper_bound(last).min(self.max)
        };
        HistogramSnapshot { buckets, min, max }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn filled(values: impl IntoIterator<Item = u64>) -> HistogramSnapshot {
        let histogram = Histogram::new();
        for value in values {
            histogram.record(value);
        }
        histogram.snapshot()
    }

    #[test]
    fn bucket_count_is_in_expected_range() {
        assert_eq!(BUCKET_COUNT, 160);
    }

    #[test]
    fn small_values_have_exact_buckets() {
        for value in 0..SUB_BUCKETS as u64 {
            let index = bucket_index(value);
            assert_eq!(index, value as usize);
            assert_eq!(bucket_lower_bound(index), value);
            assert_eq!(bucket_upper_bound(index), value);
        }
    }

    #[test]
    fn powers_of_two_start_a_bucket() {
        for exponent in SUB_BUCKET_BITS..=MAX_EXPONENT {
            let value = 1u64 << exponent;
            let index = bucket_index(value);
            assert_eq!(bucket_lower_bound(index), value, "2^{exponent}");
            assert_eq!(bucket_index(value - 1), index - 1, "2^{exponent} - 1");
        }
    }

    #[test]
    fn every_value_lies_within_its_bucket_bounds() {
        let samples = (0..2000u64).chain((0..64).map(|s| (1u64 << (s % 41)) + s * 7));
        for value in samples {
            let index = bucket_index(value);
            assert!(bucket_lower_bound(index) <= value, "{value}");
            assert!(value <= bucket_upper_bound(index), "{value}");
        }
    }

    #[test]
    fn buckets_are_contiguous() {
        for index in 0..BUCKET_COUNT - 1 {
            assert_eq!(bucket_upper_bound(index) + 1, bucket_lower_bound(index + 1));
        }
    }

    #[test]
    fn largest_values_land_in_last_bucket() {
        let top_of_range = (1u64 << (MAX_EXPONENT + 1)) - 1;
        assert_eq!(bucket_index(top_of_range), BUCKET_COUNT - 1);
        assert_eq!(bucket_index(1u64 << (MAX_EXPONENT + 1)), BUCKET_COUNT - 1);
        assert_eq!(bucket_index(u64::MAX), BUCKET_COUNT - 1);
        assert_eq!(bucket_upper_bound(BUCKET_COUNT - 1), u64::MAX);
    }

    #[test]
    fn percentiles_of_one_to_hundred() {
        let snapshot = filled(1..=100);
        assert_eq!(snapshot.count(), 100);
        assert_eq!((snapshot.min, snapshot.max), (1, 100));
        let p50 = snapshot.percentile(50.0);
        assert!((50..=50 + 50 / 4).contains(&p50), "p50 = {p50}");
        let p99 = snapshot.percentile(99.0);
        assert!((99..=100).contains(&p99), "p99 = {p99}");
        assert_eq!(snapshot.percentile(100.0), 100);
        assert_eq!(snapshot.percentile(0.0), 1);
    }

    #[test]
    fn percentile_is_clamped_to_observed_max() {
        let snapshot = filled([1000; 10]);
        assert_eq!(snapshot.percentile(50.0), 1000);
        assert_eq!(snapshot.percentile(99.9), 1000);
    }

    #[test]
    fn percentile_of_skewed_distribution() {
        let snapshot = filled((0..990).map(|_| 10).chain((0..10).map(|_| 100_000)));
        assert!(snapshot.percentile(50.0) <= 11);
        assert!(snapshot.percentile(99.0) <= 11);
        assert_eq!(snapshot.percentile(99.5), 100_000);
    }

    #[test]
    fn empty_histogram() {
        let snapshot = Histogram::new().snapshot();
        assert_eq!(snapshot.count(), 0);
        assert_eq!(snapshot.percentile(50.0), 0);
        assert_eq!((snapshot.min, snapshot.max), (0, 0));
    }

    #[test]
    fn merge_adds_counts_and_extremes() {
        let mut merged = filled(1..=50);
        merged.merge(&filled(51..=100));
        assert_eq!(merged, filled(1..=100));
        let mut from_empty = HistogramSnapshot::default();
        from_empty.merge(&filled([7, 9]));
        assert_eq!(from_empty, filled([7, 9]));
        from_empty.merge(&HistogramSnapshot::default());
        assert_eq!(from_empty, filled([7, 9]));
    }

    #[test]
    fn delta_counts_only_the_window() {
        let histogram = Histogram::new();
        (1..=10).for_each(|v| histogram.record(v * 100));
        let earlier = histogram.snapshot();
        histogram.record(5000);
        histogram.record(300);
        let window = histogram.snapshot().delta(&earlier);
        assert_eq!(window.count(), 2);
        assert_eq!(window.max, 5000);
        assert!(window.min >= 100 && window.min <= 300, "{}", window.min);
        assert_eq!(histogram.snapshot().delta(&histogram.snapshot()).count(), 0);
    }
}
