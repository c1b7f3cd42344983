//! Jobs: submit, list, count by queue, read, explain, logs, timeline, cancel.

use super::*;

pub(super) async fn submit(x: Harness) {
    let ok = x.json(A, Call::Submit(job("s-1"))).await.unwrap();
    assert_eq!(ok["created"], true, "{ok}");
    // Again with the same key: the same job.
    let again = x.json(A, Call::Submit(job("s-1"))).await.unwrap();
    assert_eq!(again["job"], ok["job"]);
    let watcher = token(&x, Some("team-a"), &["watch"]).await;
    assert_eq!(
        code(x.json(Some(&watcher), Call::Submit(job("s-2"))).await),
        ErrorCode::Forbidden
    );
    let e = via_http(
        &x,
        A,
        &calls::SUBMIT,
        &[],
        "",
        r#"{"v":1,"tenant":"team-a"}"#,
    )
    .await
    .unwrap_err();
    assert_eq!(
        (e.code, e.field.as_deref()),
        (ErrorCode::Malformed, Some("idempotency_key")),
        "{e:?}"
    );
}

pub(super) async fn list_jobs(x: Harness) {
    let id = submit_one(&x, "l-1").await;
    let page = x
        .json(A, Call::ListJobs(wire(json!({"v": 1}))))
        .await
        .unwrap();
    assert_eq!(page["jobs"][0]["job"], id.as_str(), "{page}");
    let other = token(&x, Some("team-b"), &["watch"]).await;
    let theirs = x
        .json(Some(&other), Call::ListJobs(wire(json!({"v": 1}))))
        .await
        .unwrap();
    assert_eq!(theirs["jobs"], json!([]), "another tenant sees none");
    let e = via_http(&x, A, &calls::LIST_JOBS, &[], "cursor=nowhere", "")
        .await
        .unwrap_err();
    assert_eq!(e.field.as_deref(), Some("cursor"), "{e:?}");
}

pub(super) async fn queues(x: Harness) {
    submit_one(&x, "q-1").await;
    let v = x
        .json(A, Call::Queues(wire(json!({"v": 1}))))
        .await
        .unwrap();
    assert!(!v["queues"].as_array().unwrap().is_empty(), "{v}");
    let own = token(&x, Some("team-b"), &["watch"]).await;
    let asks_other = Call::Queues(wire(json!({"v": 1, "tenant": "team-a"})));
    assert_eq!(
        code(x.json(Some(&own), asks_other).await),
        ErrorCode::Forbidden
    );
}

pub(super) async fn get_job(x: Harness) {
    let id = submit_one(&x, "g-1").await;
    let v = x.json(A, Call::GetJob(id.clone())).await.unwrap();
    assert_eq!(v["job"], id.as_str());
    let other = token(&x, Some("team-b"), &["watch"]).await;
    assert_eq!(
        code(x.json(Some(&other), Call::GetJob(id)).await),
        ErrorCode::NotFound
    );
    let e = via_http(&x, A, &calls::GET_JOB, &[("id", "not an id!")], "", "")
        .await
        .unwrap_err();
    assert_eq!(e.field.as_deref(), Some("job"), "{e:?}");
}

pub(super) async fn explain(x: Harness) {
    let id = submit_one(&x, "e-1").await;
    let v = x
        .json(
            A,
            Call::Explain {
                job: id.clone(),
                all: true,
            },
        )
        .await
        .unwrap();
    assert!(v["candidates"].is_array(), "{v}");
    let other = token(&x, Some("team-b"), &["watch"]).await;
    let hidden = Call::Explain {
        job: id.clone(),
        all: false,
    };
    assert_eq!(
        code(x.json(Some(&other), hidden).await),
        ErrorCode::NotFound
    );
    let e = via_http(
        &x,
        A,
        &calls::EXPLAIN,
        &[("id", id.as_str())],
        "everything=1",
        "",
    )
    .await
    .unwrap_err();
    assert_eq!(e.code, ErrorCode::Malformed, "{e:?}");
}

pub(super) async fn logs(x: Harness) {
    // A job no site can run has no attempt whose log a site could be asked for (a running job's log comes
    // from its site over NATS, which the harness has not: the e2e tests read it).
    let id = submit_waiting(&x, "o-1").await;
    let e = x
        .json(A, Call::Logs { job: id, lines: 10 })
        .await
        .unwrap_err();
    assert!(e.message.contains("a started attempt"), "{e:?}");
    let e = via_http(&x, A, &calls::LOGS, &[("id", "j")], "lines=ten", "")
        .await
        .unwrap_err();
    assert_eq!(e.code, ErrorCode::Malformed, "{e:?}");
}

pub(super) async fn timeline(x: Harness) {
    let id = submit_waiting(&x, "t-1").await;
    let v = x.json(A, Call::Timeline(id.clone())).await.unwrap();
    assert_eq!(v["events"][0]["event"], "submitted", "{v}");
    assert!(v["log_error"].is_string(), "no log without an attempt: {v}");
    let other = token(&x, Some("team-b"), &["watch"]).await;
    assert_eq!(
        code(x.json(Some(&other), Call::Timeline(id)).await),
        ErrorCode::NotFound
    );
}

pub(super) async fn cancel(x: Harness) {
    let id = submit_one(&x, "c-1").await;
    let watcher = token(&x, Some("team-a"), &["watch"]).await;
    assert_eq!(
        code(x.json(Some(&watcher), Call::Cancel(id.clone())).await),
        ErrorCode::Forbidden
    );
    let other = token(&x, Some("team-b"), &["cancel"]).await;
    assert_eq!(
        code(x.json(Some(&other), Call::Cancel(id.clone())).await),
        ErrorCode::NotFound
    );
    let v = x.json(A, Call::Cancel(id.clone())).await.unwrap();
    // Offered to site-a: the site is told to stop it, and the job ends when it says so.
    assert_eq!(v["phase"], "cancelling", "{v}");
    let sent = x.outbox.lock().unwrap();
    assert!(
        sent.iter().any(
            |c| matches!(c, meridian_core::reactor::Command::Cancel { site, cancel }
            if site.as_str() == "site-a" && cancel.job == id)
        ),
        "{sent:?}"
    );
}
