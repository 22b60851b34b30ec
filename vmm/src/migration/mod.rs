//! Live migration in Cloud Hypervisor's protocol (`vm.send-migration`,
//! `vm.receive-migration`): [`protocol`] the wire format, [`receiver`] the receiving state
//! machine, [`sender`] precopy and the stop rule, [`transport`] `unix:` and `tcp:`
//! connections. What a VM sends and becomes is the launch's (`launch/migrate.rs`). See
//! docs/migration.md.

pub mod protocol;
pub mod receiver;
pub mod sender;
pub mod transport;

#[cfg(test)]
mod tests;

use thiserror::Error;

use crate::snapshot::SnapshotError;

/// Why a migration failed.
#[derive(Debug, Error)]
pub enum MigrationError {
    #[error("'{0}' is not a unix:PATH or tcp:HOST:PORT URL")]
    Url(String),
    #[error("Cannot {0} {1}: {2}")]
    Connect(&'static str, String, std::io::Error),
    #[error("Connection failed {0}: {1}")]
    Io(&'static str, std::io::Error),
    #[error("The peer broke the protocol: {0}")]
    Protocol(String),
    #[error("The destination refused the {0} request (its VMM says why)")]
    Refused(&'static str),
    #[error("The source abandoned the migration")]
    Abandoned,
    #[error("{0}")]
    Unsupported(String),
    #[error("Dirty pages did not fit the downtime within timeout_s ({0} s): cancelled (timeout_strategy Cancel)")]
    Timeout(u64),
    #[error("{0}")]
    Destination(String),
    #[error(transparent)]
    Snapshot(#[from] SnapshotError),
}

impl MigrationError {
    /// Whether the request or its peer is at fault (400), not this host (500).
    pub fn is_input_fault(&self) -> bool {
        match self {
            MigrationError::Snapshot(e) => e.is_input_fault(),
            MigrationError::Destination(_) => false,
            _ => true,
        }
    }
}
