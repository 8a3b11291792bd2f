//! The pools' routes: pools, offers, allocs (accept, keepalive, free) and stop-if-idle. The
//! machinery over them (mux, caching, allocate, keepalive) is in the modules beside this one.

use std::time::Duration;

use reqwest::Method;

use crate::path::*;
use crate::*;

impl Client {
    /// `GET /v1/pools`, every page: every pool with its capacity and use, by name.
    pub async fn pools(&self) -> Result<PoolList, ClientError> {
        self.all_pages("/v1/pools").await
    }

    /// `GET /v1/pools`: one page of the pools, by name.
    pub async fn pools_page(&self, page: &PageArgs) -> Result<PoolList, ClientError> {
        self.page("/v1/pools", page).await
    }

    /// `GET /v1/pools/{pool}`.
    pub async fn pool(&self, pool: &str) -> Result<Pool, ClientError> {
        self.json(self.request(Method::GET, &pool_path(pool)?)?).await
    }

    /// `PUT /v1/pools/{pool}`: creates a pool with `capacity` (e.g. `cpu=4,mem=16GiB`) or
    /// changes it; a stopped pool starts again.
    pub async fn put_pool(&self, pool: &str, capacity: &str) -> Result<PutPoolResponse, ClientError> {
        let body = PutPool { capacity: capacity.to_owned(), labels: None, plugins: None, occupied: None };
        self.json(self.request(Method::PUT, &pool_path(pool)?)?.json(&body)).await
    }

    /// `PUT /v1/pools/{pool}` with everything a pool takes: `labels` (none: keep them) and
    /// `plugins`, the task types its executor runs (none: keep them).
    pub async fn put_pool_with(&self, pool: &str, body: &PutPool) -> Result<PutPoolResponse, ClientError> {
        self.json(self.request(Method::PUT, &pool_path(pool)?)?.json(body)).await
    }

    /// `PUT /v1/pools/{pool}` with labels: creates or changes a pool and replaces its labels
    /// (what the scheduler's selectors match).
    pub async fn put_pool_with_labels(
        &self,
        pool: &str,
        capacity: &str,
        labels: std::collections::BTreeMap<String, String>,
    ) -> Result<PutPoolResponse, ClientError> {
        let body = PutPool { capacity: capacity.to_owned(), labels: Some(labels), plugins: None, occupied: None };
        self.json(self.request(Method::PUT, &pool_path(pool)?)?.json(&body)).await
    }

    /// `POST /v1/pools/{pool}/cordon`: the pool takes no new allocs; what runs there runs on.
    pub async fn cordon_pool(&self, pool: &str) -> Result<Pool, ClientError> {
        let path = format!("{}/cordon", pool_path(pool)?);
        self.json(self.request(Method::POST, &path)?).await
    }

    /// `POST /v1/pools/{pool}/drain`: cordons the pool and preempts its tasks once `grace` has
    /// passed (none: the daemon's default, 30 s).
    pub async fn drain_pool(&self, pool: &str, grace: Option<Duration>) -> Result<Pool, ClientError> {
        let path = format!("{}/drain", pool_path(pool)?);
        let body = Drain { grace_ms: grace.map(|g| g.as_millis().try_into().unwrap_or(u64::MAX)) };
        self.json(self.request(Method::POST, &path)?.json(&body)).await
    }

    /// `POST /v1/pools/{pool}/uncordon`: the pool takes allocs again; a drain not carried out
    /// yet is called off.
    pub async fn uncordon_pool(&self, pool: &str) -> Result<Pool, ClientError> {
        let path = format!("{}/uncordon", pool_path(pool)?);
        self.json(self.request(Method::POST, &path)?).await
    }

    /// `DELETE /v1/pools/{pool}`: removes a pool; with `force` also when it has allocs.
    pub async fn remove_pool(&self, pool: &str, force: bool) -> Result<RemovedPool, ClientError> {
        let path = format!("{}?force={force}", pool_path(pool)?);
        self.json(self.request(Method::DELETE, &path)?).await
    }

    /// `GET /v1/pools/{pool}/offers`: the pool's offer (everything free), if any.
    pub async fn offers(&self, pool: &str) -> Result<OfferList, ClientError> {
        let path = format!("{}/offers", pool_path(pool)?);
        self.json(self.request(Method::GET, &path)?).await
    }

    /// `GET /v1/pools/{pool}/offers/{offer}`: one offer (`offer_not_found` when the pool has
    /// nothing free, or no offer of that id).
    pub async fn offer(&self, pool: &str, offer: &str) -> Result<Offer, ClientError> {
        let path = format!("{}/offers/{}", pool_path(pool)?, segment("offer", offer)?);
        self.json(self.request(Method::GET, &path)?).await
    }

    /// `POST /v1/pools/{pool}/offers/{offer}`: accepts an offer. `offer_expired` (409) means the
    /// room is gone: try another offer.
    pub async fn accept(&self, pool: &str, offer: &str, request: &Accept) -> Result<Alloc, ClientError> {
        let path = format!("{}/offers/{}", pool_path(pool)?, segment("offer", offer)?);
        self.json(self.request(Method::POST, &path)?.json(request)).await
    }

    /// `GET /v1/pools/{pool}/allocs`, every page: the live allocs of a pool, by id.
    pub async fn allocs(&self, pool: &str) -> Result<AllocList, ClientError> {
        self.all_pages(&format!("{}/allocs", pool_path(pool)?)).await
    }

    /// `GET /v1/pools/{pool}/allocs`: one page of the live allocs of a pool, by id.
    pub async fn allocs_page(&self, pool: &str, page: &PageArgs) -> Result<AllocList, ClientError> {
        self.page(&format!("{}/allocs", pool_path(pool)?), page).await
    }

    /// `GET /v1/pools/{pool}/allocs/{alloc}`: an alloc, live or ended (the daemon answers an
    /// ended one with 410 Gone and its record; `ended` says why).
    pub async fn alloc(&self, pool: &str, alloc: &str) -> Result<Alloc, ClientError> {
        let (request, body) =
            self.send_accepting(self.request(Method::GET, &alloc_path(pool, alloc)?)?, Some(410)).await?;
        serde_json::from_slice(&body).map_err(|err| decode_error(request, err, &body))
    }

    /// `POST /v1/pools/{pool}/allocs/{alloc}/keepalive`: renews the lease; answers the interval
    /// granted. `alloc_ended` (409) is final.
    pub async fn keepalive_alloc(
        &self,
        pool: &str,
        alloc: &str,
        interval: Duration,
    ) -> Result<AllocKeepaliveResponse, ClientError> {
        let path = format!("{}/keepalive", alloc_path(pool, alloc)?);
        let body = AllocKeepalive { interval_ms: interval.as_millis().min(u128::from(u64::MAX)) as u64 };
        self.json(self.request(Method::POST, &path)?.json(&body)).await
    }

    /// `PATCH /v1/pools/{pool}/allocs/{alloc}`: changes the labels and metadata an owner
    /// attaches to its live alloc (what runs in it, its results); what `notes` does not name is
    /// kept, and the lease is not renewed.
    pub async fn annotate_alloc(&self, pool: &str, alloc: &str, notes: &AnnotateAlloc) -> Result<Alloc, ClientError> {
        self.json(self.request(Method::PATCH, &alloc_path(pool, alloc)?)?.json(notes)).await
    }

    /// `GET /v1/pools/{pool}/allocs/{alloc}/run`: the run (phases, outputs) of the task in an
    /// alloc the scheduler holds, while the alloc is kept.
    pub async fn alloc_run(&self, pool: &str, alloc: &str) -> Result<TaskRun, ClientError> {
        self.json(self.request(Method::GET, &format!("{}/run", alloc_path(pool, alloc)?))?).await
    }

    /// `DELETE /v1/pools/{pool}/allocs/{alloc}`: frees an alloc.
    pub async fn free_alloc(&self, pool: &str, alloc: &str) -> Result<Alloc, ClientError> {
        self.json(self.request(Method::DELETE, &alloc_path(pool, alloc)?)?).await
    }

    /// `POST /v1/pools/{pool}/stop-if-idle`: stops the pool if it has been idle for `idle`.
    pub async fn stop_if_idle(&self, pool: &str, idle: Duration) -> Result<StopIfIdleResponse, ClientError> {
        let path = format!("{}/stop-if-idle", pool_path(pool)?);
        let body = StopIfIdle { idle_ms: idle.as_millis().min(u128::from(u64::MAX)) as u64 };
        self.json(self.request(Method::POST, &path)?.json(&body)).await
    }
}
