//! The runs' routes: how a task is being run by its plugin, its logs, its wake-up, and its
//! plugin's catalog.

use reqwest::Method;

use crate::path::*;
use crate::*;

impl Client {
    /// `GET /v1/apps/{app}/tasks/{task}/run`: how the task is being run, and its phase timeline.
    pub async fn task_run(&self, app: &str, task: &str) -> Result<TaskRun, ClientError> {
        self.json(self.request(Method::GET, &format!("{}/run", task_path(app, task)?))?).await
    }

    /// `GET /v1/apps/{app}/tasks/{task}/logs`: a piece of a task's log (`stream`, default
    /// `stdout`) of `attempt` (default the current one) from `offset`, on the daemon that runs it.
    pub async fn task_logs(
        &self,
        app: &str,
        task: &str,
        stream: Option<&str>,
        attempt: Option<u32>,
        offset: u64,
    ) -> Result<TaskLogs, ClientError> {
        let mut request = self.request(Method::GET, &format!("{}/logs", task_path(app, task)?))?;
        request = request.query(&[("offset", offset.to_string())]);
        if let Some(stream) = stream {
            request = request.query(&[("stream", stream)]);
        }
        if let Some(attempt) = attempt {
            request = request.query(&[("attempt", attempt.to_string())]);
        }
        self.json(request).await
    }

    /// `POST /v1/apps/{app}/tasks/{task}/wake`: the task's plugin runs its next round at once,
    /// on the daemon that runs it.
    pub async fn wake_task(&self, app: &str, task: &str) -> Result<Woken, ClientError> {
        self.json(self.request(Method::POST, &format!("{}/wake", task_path(app, task)?))?).await
    }

    /// `POST /v1/apps/{app}/tasks/{task}/catalog/lookup`: an entry of the catalog of the plugin
    /// that runs the task, in its queue (a plugin's call, on the daemon that runs the task).
    pub async fn catalog_lookup(
        &self,
        app: &str,
        task: &str,
        lookup: &CatalogLookup,
    ) -> Result<CatalogFound, ClientError> {
        let path = format!("{}/catalog/lookup", task_path(app, task)?);
        self.json(self.request(Method::POST, &path)?.json(lookup)).await
    }

    /// `POST /v1/apps/{app}/tasks/{task}/catalog`: keeps outputs in the catalog of the plugin that
    /// runs the task, unless an entry is kept under their key already (`created` false: it stays).
    pub async fn catalog_put(&self, app: &str, task: &str, put: &CatalogPut) -> Result<CatalogKept, ClientError> {
        self.json(self.request(Method::POST, &format!("{}/catalog", task_path(app, task)?))?.json(put)).await
    }
}
