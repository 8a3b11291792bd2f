//! `GET /v1/snapshot`: the daemon's whole store as one archive, streamed.

use std::time::Duration;

use bytes::Bytes;
use reqwest::Method;

use crate::{api_error, Client, ClientError};

/// How long a snapshot may take to arrive (a store of millions of records is hundreds of MB).
const SNAPSHOT_TIMEOUT: Duration = Duration::from_secs(3600);

/// An archive on its way from the daemon, read a piece at a time.
#[derive(Debug)]
pub struct SnapshotStream {
    response: reqwest::Response,
}

impl SnapshotStream {
    /// The next piece of the archive; `None` at its end. An archive cut short ends early: check
    /// it whole (`allot_store::snapshot::verify`) before trusting it.
    pub async fn chunk(&mut self) -> Result<Option<Bytes>, ClientError> {
        Ok(self.response.chunk().await?)
    }
}

impl Client {
    /// A point-in-time archive of everything the daemon's store holds (the daemon's `admin`
    /// permission), as it streams in.
    pub async fn snapshot(&self) -> Result<SnapshotStream, ClientError> {
        let what = "GET /v1/snapshot";
        let response = self.request(Method::GET, "/v1/snapshot")?.timeout(SNAPSHOT_TIMEOUT).send().await?;
        let status = response.status();
        if !status.is_success() {
            let body = response.bytes().await?;
            return Err(api_error(what, status, &body));
        }
        Ok(SnapshotStream { response })
    }
}
