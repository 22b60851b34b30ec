//! A short run of every fuzz target (exitless_lab::fuzzing): each file of its checked-in corpus
//! (fuzz/corpus/NAME, seeds and regressions), then mutations of them for a second, from a
//! fixed seed so a failure repeats. A panic here is a bug a guest could trigger; the input is
//! printed so it can become a regression file. `cargo +nightly fuzz run NAME` runs one for
//! hours (docs/fuzzing.md).

use std::path::Path;
use std::time::{Duration, Instant};

/// xorshift64*: reproducible mutations without a dependency.
struct Rand(u64);

impl Rand {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// One libFuzzer-like mutation: flip, set interesting values, insert, erase, splice.
fn mutate(input: &[u8], other: &[u8], rand: &mut Rand) -> Vec<u8> {
    let mut out = input.to_vec();
    for _ in 0..1 + rand.below(4) {
        let at = rand.below(out.len() + 1);
        match rand.below(6) {
            0 if at < out.len() => out[at] ^= 1 << rand.below(8),
            1 if at < out.len() => out[at] = [0, 0xff, 0x7f, 0x80, 1, 16][rand.below(6)],
            2 => out.insert(at, rand.next() as u8),
            3 if at < out.len() => {
                out.remove(at);
            }
            4 => {
                let from = rand.below(other.len());
                let take = rand.below(64).min(other.len() - from);
                out.splice(at..at, other[from..from + take].iter().copied());
            }
            _ => out.truncate(at.max(1)),
        }
    }
    out
}

fn corpus(target: &str) -> Vec<Vec<u8>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fuzz/corpus")
        .join(target);
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|f| f.unwrap().path())
        .filter(|p| {
            let name = p.file_name().unwrap().to_string_lossy();
            name.starts_with("seed-") || name.starts_with("regression-")
        })
        .collect();
    files.sort();
    files
        .into_iter()
        .map(|p| std::fs::read(p).unwrap())
        .collect()
}

/// Runs `f` on `input`; on a panic, says which target and input before failing.
fn run_one(target: &str, f: fn(&[u8]), input: &[u8]) {
    if std::panic::catch_unwind(|| f(input)).is_err() {
        panic!("fuzz target {target} panicked on input {input:02x?}");
    }
}

#[test]
fn every_fuzz_target_survives_its_corpus_and_a_second_of_mutations() {
    for &(target, f) in exitless_lab::fuzzing::TARGETS {
        let seeds = corpus(target);
        assert!(!seeds.is_empty(), "fuzz/corpus/{target} has no seed");
        for input in &seeds {
            run_one(target, f, input);
        }
        let mut rand = Rand(0x9e37_79b9_7f4a_7c15 ^ target.len() as u64);
        let (start, mut runs) = (Instant::now(), 0);
        while start.elapsed() < Duration::from_millis(700) {
            let base = &seeds[rand.below(seeds.len())];
            let other = &seeds[rand.below(seeds.len())];
            run_one(target, f, &mutate(base, other, &mut rand));
            runs += 1;
        }
        eprintln!("fuzz {target}: {} seeds, {runs} mutations", seeds.len());
    }
}
