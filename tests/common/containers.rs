//! Docker for the test harnesses: a client, the containers that carry a
//! label, and their removal when a harness drops.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use bollard::models::ContainerSummary;
use bollard::query_parameters::ListContainersOptions;
use code_runner::sandbox::force_remove;

/// A Docker client that speaks the daemon's API version (dockerd 20.10 refuses
/// bollard's default version).
pub async fn docker() -> bollard::Docker {
    bollard::Docker::connect_with_defaults()
        .expect("docker client")
        .negotiate_version()
        .await
        .expect("dockerd must be running for the integration tests (scripts/test starts it)")
}

/// The containers (any state) with `label` (`key` or `key=value`).
pub async fn list_labelled(
    docker: &bollard::Docker,
    label: &str,
) -> Result<Vec<ContainerSummary>, bollard::errors::Error> {
    let filters = HashMap::from([("label".to_string(), vec![label.to_string()])]);
    let options = ListContainersOptions {
        all: true,
        filters: Some(filters),
        ..Default::default()
    };
    docker.list_containers(Some(options)).await
}

/// Ids of the containers (any state) with `label` (`key` or `key=value`).
pub async fn containers_labelled(docker: &bollard::Docker, label: &str) -> Vec<String> {
    list_labelled(docker, label)
        .await
        .expect("docker lists containers")
        .into_iter()
        .filter_map(|c| c.id)
        .collect()
}

/// Waits (up to 10 s) until `leftovers` lists no container; fails the test
/// with `what` and their ids otherwise.
pub async fn assert_none_left(what: &str, leftovers: impl AsyncFn() -> Vec<String>) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let left = leftovers().await;
        if left.is_empty() {
            return;
        }
        if Instant::now() > deadline {
            panic!("{what}: {left:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Force-removes every container with `label` that `select` picks. Runs in
/// `Drop`, also when the test failed: from a thread and a runtime of its own,
/// because the test's runtime may be gone; errors are ignored.
pub fn remove_labelled(label: String, select: impl Fn(&ContainerSummary) -> bool + Send + 'static) {
    let _ = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .ok()?;
        runtime.block_on(async move {
            let docker = bollard::Docker::connect_with_defaults()
                .ok()?
                .negotiate_version()
                .await
                .ok()?;
            for container in list_labelled(&docker, &label).await.ok()? {
                if select(&container)
                    && let Some(id) = container.id
                {
                    let _ = force_remove(&docker, &id).await;
                }
            }
            Some(())
        })
    })
    .join();
}
