//! Services: deploy, read, delete, scale in, routes, watches and demand.

use super::*;

pub(super) async fn scale_in(x: Harness) {
    x.json(A, Call::ServiceDeploy(service())).await.unwrap();
    let req = || wire(json!({"v": 1, "tenant": "team-a", "service": "chat", "remove": 1}));
    let watcher = token(&x, Some("team-a"), &["watch"]).await;
    assert_eq!(
        code(x.json(Some(&watcher), Call::ScaleIn(req())).await),
        ErrorCode::Forbidden
    );
    let v = x.json(A, Call::ScaleIn(req())).await.unwrap();
    assert!(v["stopping"].is_array(), "{v}");
}

pub(super) async fn service_deploy(x: Harness) {
    let v = x.json(A, Call::ServiceDeploy(service())).await.unwrap();
    assert_eq!(v["spec"]["name"], "chat", "{v}");
    let viewer = token(&x, None, &["viewer"]).await;
    assert_eq!(
        code(x.json(Some(&viewer), Call::ServiceDeploy(service())).await),
        ErrorCode::Forbidden
    );
    let e = via_http(&x, A, &calls::SERVICE_DEPLOY, &[], "", r#"{"name":"x"}"#)
        .await
        .unwrap_err();
    assert_eq!(e.field.as_deref(), Some("tenant"), "{e:?}");
}

pub(super) async fn services(x: Harness) {
    x.json(A, Call::ServiceDeploy(service())).await.unwrap();
    let all = x
        .json(A, Call::Services(service_ref(None, None)))
        .await
        .unwrap();
    assert_eq!(all.as_array().unwrap().len(), 1, "{all}");
    let one = x
        .json(A, Call::Services(service_ref(Some("team-a"), Some("chat"))))
        .await
        .unwrap();
    assert_eq!(one["spec"]["name"], "chat", "{one}");
    let other = token(&x, Some("team-b"), &["watch"]).await;
    let theirs = Call::Services(service_ref(Some("team-a"), None));
    assert_eq!(
        code(x.json(Some(&other), theirs).await),
        ErrorCode::Forbidden
    );
}

pub(super) async fn service_delete(x: Harness) {
    x.json(A, Call::ServiceDeploy(service())).await.unwrap();
    let other = token(&x, Some("team-b"), &["cancel"]).await;
    let named = || service_ref(Some("team-b"), Some("chat"));
    assert_eq!(
        code(x.json(Some(&other), Call::ServiceDelete(named())).await),
        ErrorCode::NotFound
    );
    let v = x
        .json(
            A,
            Call::ServiceDelete(service_ref(Some("team-a"), Some("chat"))),
        )
        .await
        .unwrap();
    assert!(v["stopping"].is_array(), "{v}");
}

pub(super) async fn service_routes(x: Harness) {
    x.json(A, Call::ServiceDeploy(service())).await.unwrap();
    let v = x
        .json(
            A,
            Call::ServiceRoutes(service_ref(Some("team-a"), Some("chat"))),
        )
        .await
        .unwrap();
    assert_eq!(v["service"], "chat", "{v}");
    let e = x
        .json(A, Call::ServiceRoutes(service_ref(None, Some("chat"))))
        .await
        .unwrap_err();
    assert_eq!(e.field.as_deref(), Some("tenant"), "{e:?}");
}

pub(super) async fn service_routes_watch(x: Harness) {
    x.json(A, Call::ServiceDeploy(service())).await.unwrap();
    let inbox = crate::service::reply::Inbox::for_tests("_INBOX.operator.w");
    let req = || wire(json!({"v": 1, "tenant": "team-a", "name": "chat"}));
    let v = x
        .json(A, Call::ServiceRoutesWatch(req(), inbox.clone()))
        .await
        .unwrap();
    assert_eq!(v["seq"], 1, "{v}");
    let renewed = x
        .json(A, Call::ServiceRoutesWatch(req(), inbox))
        .await
        .unwrap();
    assert_eq!(renewed["seq"], 2, "a renewal is numbered on: {renewed}");
    let other = token(&x, Some("team-b"), &["watch"]).await;
    let inbox = crate::service::reply::Inbox::for_tests("_INBOX.b.w");
    let theirs = Call::ServiceRoutesWatch(
        wire(json!({"v": 1, "tenant": "team-b", "name": "chat"})),
        inbox,
    );
    assert_eq!(
        code(x.json(Some(&other), theirs).await),
        ErrorCode::NotFound
    );
}

pub(super) async fn service_demand(x: Harness) {
    x.json(A, Call::ServiceDeploy(service())).await.unwrap();
    let report = || {
        wire(json!({"v": 1, "tenant": "team-a", "service": "chat",
            "locations": [{"name": "fra", "location": {"lat": 50.1, "lon": 8.7}, "per_s": 5.0}]}))
    };
    let gateway = token(&x, Some("team-a"), &["gateway:chat"]).await;
    x.json(Some(&gateway), Call::ServiceDemand(report()))
        .await
        .unwrap();
    let watcher = token(&x, Some("team-a"), &["watch"]).await;
    assert_eq!(
        code(x.json(Some(&watcher), Call::ServiceDemand(report())).await),
        ErrorCode::Forbidden
    );
    let e = via_http(
        &x,
        A,
        &calls::SERVICE_DEMAND,
        &[("name", "chat")],
        "",
        r#"{"service":"other"}"#,
    )
    .await
    .unwrap_err();
    assert_eq!(e.field.as_deref(), Some("service"), "{e:?}");
}
