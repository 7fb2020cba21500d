//! Storage calls: what a node can store, what is stored, and putting ISOs there.

use super::client::{Body, DELETE, POST, Params, Pool, ProxmoxClient, Replay, UploadContent};
use super::error::{ProxmoxError, Result};
use super::property::StorageId;
use super::types::{NodeName, NodeStorage, StorageVolume, Upid};

impl ProxmoxClient {
    /// `GET /nodes/{node}/storage`: storages as the node sees them, with real free space.
    pub async fn node_storages(&self, node: &NodeName) -> Result<Vec<NodeStorage>> {
        let path = ["nodes", node.as_str(), "storage"];
        self.get(&path, Params::new()).await
    }

    /// `GET /nodes/{node}/storage/{storage}/content[?content=…][&vmid=…]`.
    pub async fn storage_content(
        &self,
        node: &NodeName,
        storage: &str,
        content: Option<&str>,
    ) -> Result<Vec<StorageVolume>> {
        let params = Params::new().with_opt("content", content);
        // A storage holds a seed ISO per machine: the answer grows with the cluster.
        let path = storage_path(node, storage, &["content"])?;
        self.get_over(Pool::Large, &path, params).await
    }

    /// `POST /nodes/{node}/storage/{storage}/download-url`: the node fetches `url` itself into its
    /// `content` directory (`iso`, `import`) as `file_name`, so large images never pass through us.
    /// Returns the download task.
    pub async fn download_url(
        &self,
        node: &NodeName,
        storage: &str,
        content: &str,
        file_name: &str,
        url: &str,
    ) -> Result<Upid> {
        let params = Params::new()
            .with("content", content)
            .with("filename", file_name)
            .with("url", url);
        let path = storage_path(node, storage, &["download-url"])?;
        self.send(POST, &path, params, Replay::OnlyIfUnsent).await
    }

    /// `POST /nodes/{node}/storage/{storage}/upload` (multipart): returns the import task.
    pub async fn upload_file(
        &self,
        node: &NodeName,
        storage: &str,
        content: &str,
        file_name: &str,
        body: UploadContent,
    ) -> Result<Upid> {
        let path = storage_path(node, storage, &["upload"])?;
        // Sent again only if it never left; a streamed one is never sent again and goes over the
        // connections for large bodies.
        let (pool, replay) = match body {
            UploadContent::Bytes(_) => (Pool::Small, Replay::OnlyIfUnsent),
            UploadContent::Stream { .. } => (Pool::Large, Replay::Never),
        };
        let body = Body::Upload(content, file_name, &body);
        self.call(pool, POST, &path, body, replay).await
    }

    /// `DELETE /nodes/{node}/storage/{storage}/content/{volume}`. Proxmox answers with a task or nothing.
    pub async fn delete_volume(
        &self,
        node: &NodeName,
        storage: &str,
        volume_id: &str,
    ) -> Result<Option<Upid>> {
        // Retried even when the first try may have reached Proxmox (a connection reset mid-answer):
        // the second finds the file gone ("does not exist"), which every caller counts as deleted.
        // Without the retry, one reset would leave the seed ISO behind.
        let path = storage_path(node, storage, &["content", volume_id])?;
        self.send(DELETE, &path, Params::new(), Replay::Safe).await
    }
}

/// `/nodes/{node}/storage/{storage}/<rest>`: the storage ID goes into the path, so it is checked
/// first.
fn storage_path<'a>(
    node: &'a NodeName,
    storage: &'a str,
    rest: &[&'a str],
) -> Result<Vec<&'a str>> {
    StorageId::new(storage).map_err(|e| ProxmoxError::Setup(e.to_string()))?;
    Ok([&["nodes", node.as_str(), "storage", storage], rest].concat())
}
