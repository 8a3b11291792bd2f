//! Takes two units of a namespace's quota and gives them back: the smallest program that uses
//! allot's token quotas. Run a daemon (`allot serve`), then
//! `cargo run -p allot-client --example allocate -- http://127.0.0.1:7070`.

use allot_client::{Allocate, Client, ClientError, Status};

#[tokio::main]
async fn main() -> Result<(), ClientError> {
    let base = std::env::args().nth(1).unwrap_or_else(|| "http://127.0.0.1:7070".to_owned());
    let client = Client::new(&base)?;
    client.put_namespace("hive:cluster-a", 10).await?;
    let answer =
        client.allocate("hive:cluster-a", "job-1", &Allocate { units: Some(2), ..Allocate::default() }).await?;
    if answer.status == Status::Granted {
        println!("granted: fencing number {:?}", answer.grant.as_ref().map(|g| g.fencing));
        client.release("hive:cluster-a", "job-1", None).await?;
    } else {
        println!("not granted: {:?}", answer.status);
    }
    Ok(())
}
