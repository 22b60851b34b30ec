//! PLACEHOLDER until the api-server branch lands: the types the control loop uses.
pub mod schema;
pub mod server;

pub enum ApiRequest {
    VmCreate(Box<schema::VmConfig>),
    VmBoot,
    VmShutdown,
    VmReboot,
    VmDelete,
    VmPause,
    VmResume,
    VmInfo,
    VmCounters,
    VmProfile,
    VmAddDisk(schema::DiskConfig),
    VmAddNet(schema::NetConfig, Vec<std::os::fd::OwnedFd>),
    VmAddVsock(schema::VsockConfig),
    VmRemoveDevice(schema::VmRemoveDevice),
    VmResize(schema::VmResize),
    VmmShutdown,
}
pub enum ApiResponse {
    NoContent,
    Json(String),
    Error(ApiError),
}
#[derive(Debug)]
pub struct ApiError {
    pub status: u16,
    pub message: String,
}
pub struct ApiCall {
    pub request: ApiRequest,
    pub reply: std::sync::mpsc::Sender<ApiResponse>,
}
