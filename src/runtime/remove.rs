//! Removing a container the way the kubelet does, for the dead-container
//! collector and the pod killer alike.

use k8s_cri::v1 as cri;

use super::{CALL_DEADLINE, bounded};

/// Removes a container the kubelet's way: its log file first (containerd
/// leaves it; the kubelet deletes it when it removes a container), then the
/// container. False when RemoveContainer failed.
pub async fn remove_container(
    rt: &mut cri::runtime_service_client::RuntimeServiceClient<tonic::transport::Channel>,
    id: &str,
) -> bool {
    let status = rt.container_status(cri::ContainerStatusRequest {
        container_id: id.to_owned(),
        verbose: false,
    });
    let status = bounded("ContainerStatus", CALL_DEADLINE, status).await;
    if let Some(log) = status
        .ok()
        .and_then(|s| s.into_inner().status)
        .map(|s| s.log_path)
        .filter(|p| !p.is_empty())
    {
        match std::fs::remove_file(&log) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(err) => {
                tracing::warn!(container = %id, log = %log, %err, "cannot remove container log")
            }
        }
    }
    let remove = rt.remove_container(cri::RemoveContainerRequest {
        container_id: id.to_owned(),
    });
    match bounded("RemoveContainer", CALL_DEADLINE, remove).await {
        Ok(_) => true,
        Err(err) => {
            tracing::warn!(container = %id, %err, "RemoveContainer failed");
            false
        }
    }
}
