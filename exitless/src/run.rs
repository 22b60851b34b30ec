//! `exitless run`: boot a Linux guest.

use clap::Args;

/// Options of `exitless run`.
#[derive(Args)]
pub struct RunArgs {}

pub fn main(_args: RunArgs) -> anyhow::Result<i32> {
    anyhow::bail!("Not implemented yet")
}
