//! The applications' routes: queues, applications and their tasks.

use reqwest::Method;

use crate::path::*;
use crate::*;

impl Client {
    /// `GET /v1/queues`: every queue, in path order.
    pub async fn queues(&self) -> Result<QueueList, ClientError> {
        self.json(self.request(Method::GET, "/v1/queues")?).await
    }

    /// `GET /v1/queues/{queue}`.
    pub async fn queue(&self, queue: &str) -> Result<Queue, ClientError> {
        self.json(self.request(Method::GET, &queue_path(queue)?)?).await
    }

    /// `PUT /v1/queues/{queue}`: creates a queue (and its parents) or changes its limits.
    pub async fn put_queue(&self, queue: &str, limits: &PutQueue) -> Result<PutQueueResponse, ClientError> {
        self.json(self.request(Method::PUT, &queue_path(queue)?)?.json(limits)).await
    }

    /// `DELETE /v1/queues/{queue}`: removes a leaf queue with no live application.
    pub async fn remove_queue(&self, queue: &str) -> Result<RemovedQueue, ClientError> {
        self.json(self.request(Method::DELETE, &queue_path(queue)?)?).await
    }

    /// `POST /v1/apps`: submits an application (and the tasks it carries).
    pub async fn submit_app(&self, app: &SubmitApp) -> Result<SubmitAppResponse, ClientError> {
        self.json(self.request(Method::POST, "/v1/apps")?.json(app)).await
    }

    /// `GET /v1/apps`, every page: every application, by id.
    pub async fn apps(&self) -> Result<AppList, ClientError> {
        self.all_pages("/v1/apps").await
    }

    /// `GET /v1/apps`: one page of the applications, by id.
    pub async fn apps_page(&self, page: &PageArgs) -> Result<AppList, ClientError> {
        self.page("/v1/apps", page).await
    }

    /// `GET /v1/apps?sort=...`: every application in `sort`'s order, every page.
    pub async fn apps_in_order(&self, sort: AppSort) -> Result<AppList, ClientError> {
        self.all_pages(&format!("/v1/apps?sort={}", sort.as_str())).await
    }

    /// `GET /v1/apps?sort=...`: one page of the applications in `sort`'s order (the cursor is of
    /// a page in the same order).
    pub async fn apps_page_in_order(&self, sort: AppSort, page: &PageArgs) -> Result<AppList, ClientError> {
        self.page(&format!("/v1/apps?sort={}", sort.as_str()), page).await
    }

    /// `GET /v1/apps/{app}`: its state, tasks by state, placeholders, and why it waits.
    pub async fn app(&self, app: &str) -> Result<App, ClientError> {
        self.json(self.request(Method::GET, &app_path(app)?)?).await
    }

    /// `DELETE /v1/apps/{app}`: removes it and releases everything it holds.
    pub async fn remove_app(&self, app: &str) -> Result<App, ClientError> {
        self.json(self.request(Method::DELETE, &app_path(app)?)?).await
    }

    /// `POST /v1/apps/{app}/complete`.
    pub async fn complete_app(&self, app: &str) -> Result<App, ClientError> {
        self.json(self.request(Method::POST, &format!("{}/complete", app_path(app)?))?).await
    }

    /// `POST /v1/apps/{app}/fail`.
    pub async fn fail_app(&self, app: &str, reason: Option<&str>) -> Result<App, ClientError> {
        let body = Fail { reason: reason.map(str::to_owned) };
        self.json(self.request(Method::POST, &format!("{}/fail", app_path(app)?))?.json(&body)).await
    }

    /// `GET /v1/apps/{app}/tasks`, every page: the application's tasks, by id.
    pub async fn tasks(&self, app: &str) -> Result<TaskList, ClientError> {
        self.all_pages(&format!("{}/tasks", app_path(app)?)).await
    }

    /// `GET /v1/apps/{app}/tasks`: one page of the application's tasks, by id.
    pub async fn tasks_page(&self, app: &str, page: &PageArgs) -> Result<TaskList, ClientError> {
        self.page(&format!("{}/tasks", app_path(app)?), page).await
    }

    /// `POST /v1/apps/{app}/tasks`: adds a task.
    pub async fn add_task(&self, app: &str, task: &AddTask) -> Result<AddTaskResponse, ClientError> {
        self.json(self.request(Method::POST, &format!("{}/tasks", app_path(app)?))?.json(task)).await
    }

    /// `GET /v1/apps/{app}/tasks/{task}`: its state, placement (alloc and tokens), or why it waits.
    pub async fn task(&self, app: &str, task: &str) -> Result<Task, ClientError> {
        self.json(self.request(Method::GET, &task_path(app, task)?)?).await
    }

    /// `DELETE /v1/apps/{app}/tasks/{task}`: removes it and releases what it holds.
    pub async fn remove_task(&self, app: &str, task: &str) -> Result<Task, ClientError> {
        self.json(self.request(Method::DELETE, &task_path(app, task)?)?).await
    }

    /// `POST /v1/apps/{app}/tasks/{task}/start`: reports an Allocated task running.
    pub async fn start_task(&self, app: &str, task: &str) -> Result<Task, ClientError> {
        self.json(self.request(Method::POST, &format!("{}/start", task_path(app, task)?))?).await
    }

    /// `POST /v1/apps/{app}/tasks/{task}/complete`: reports it completed; what it holds is released.
    pub async fn complete_task(&self, app: &str, task: &str) -> Result<Task, ClientError> {
        self.json(self.request(Method::POST, &format!("{}/complete", task_path(app, task)?))?).await
    }

    /// `POST /v1/apps/{app}/tasks/{task}/fail`: reports it failed; what it holds is released.
    pub async fn fail_task(&self, app: &str, task: &str, reason: Option<&str>) -> Result<Task, ClientError> {
        let body = Fail { reason: reason.map(str::to_owned) };
        self.json(self.request(Method::POST, &format!("{}/fail", task_path(app, task)?))?.json(&body)).await
    }

    /// `POST /v1/tasks/finish`: reports several tasks completed or failed in one call; one answer
    /// per report, in order (the task, or why its report was refused).
    pub async fn finish_tasks(&self, ends: Vec<TaskEnd>) -> Result<Vec<TaskEndAnswer>, ClientError> {
        let body = FinishTasks { tasks: ends };
        let answer: FinishedTasks = self.json(self.request(Method::POST, "/v1/tasks/finish")?.json(&body)).await?;
        Ok(answer.tasks)
    }
}
