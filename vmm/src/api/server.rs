//! PLACEHOLDER until the api-server branch lands.
use std::path::Path;
use std::sync::mpsc::Sender;

use super::ApiCall;

pub struct ApiServer;

#[derive(Debug, thiserror::Error)]
#[error("The API server is not built yet")]
pub struct ApiServerError;

impl ApiServer {
    pub fn start(_path: &Path, _calls: Sender<ApiCall>) -> Result<Self, ApiServerError> {
        Err(ApiServerError)
    }
}
