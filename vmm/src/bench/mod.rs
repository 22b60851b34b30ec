//! The exit lab: `exitless bench`.

pub mod cases;
pub mod guest;
pub mod result;
pub mod runner;
