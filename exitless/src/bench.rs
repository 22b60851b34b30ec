//! `exitless bench`: the exit lab.

use clap::Args;

/// Options of `exitless bench`.
#[derive(Args)]
pub struct BenchArgs {}

pub fn main(_args: BenchArgs) -> anyhow::Result<i32> {
    anyhow::bail!("Not implemented yet")
}
