//! Sites, reports, tenancy, the journal, tokens, the audit, metrics, session and version.

use super::*;

pub(super) async fn list_sites(x: Harness) {
    let v = x
        .json(A, Call::ListSites(Default::default()))
        .await
        .unwrap();
    assert_eq!(v.as_array().unwrap().len(), 2, "{v}");
    let in_state = |state: &'static str| {
        let x = &x;
        async move {
            let v = via_http(x, A, &calls::LIST_SITES, &[], &format!("state={state}"), "")
                .await
                .unwrap();
            v.as_array()
                .unwrap()
                .iter()
                .map(|s| s["site"].as_str().unwrap().to_owned())
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(in_state("up").await.len(), 2);
    assert!(in_state("lost").await.is_empty());
    let site = SiteId::new("site-a").unwrap();
    x.json(A, Call::Drain { site, drain: true }).await.unwrap();
    assert_eq!(in_state("draining").await, ["site-a"]);
    assert_eq!(in_state("up").await.len(), 1);
    let page = via_http(&x, A, &calls::LIST_SITES, &[], "after=site-a&limit=1", "")
        .await
        .unwrap();
    assert_eq!(page.as_array().unwrap().len(), 1, "{page}");
    assert_ne!(page[0]["site"], "site-a", "{page}");
    let e = via_http(&x, A, &calls::LIST_SITES, &[], "limit=0", "")
        .await
        .unwrap_err();
    assert_eq!(e.field.as_deref(), Some("limit"), "{e:?}");
    let e = via_http(&x, A, &calls::LIST_SITES, &[], "state=gone", "")
        .await
        .unwrap_err();
    assert_eq!(e.field.as_deref(), Some("state"), "{e:?}");
    assert_eq!(
        code(x.json(None, Call::ListSites(Default::default())).await),
        ErrorCode::Unauthenticated
    );
}

pub(super) async fn drain(x: Harness) {
    let site = SiteId::new("site-a").unwrap();
    let tenant = token(&x, Some("team-a"), &["submit", "cancel"]).await;
    let by_tenant = Call::Drain {
        site: site.clone(),
        drain: true,
    };
    assert_eq!(
        code(x.json(Some(&tenant), by_tenant).await),
        ErrorCode::Forbidden
    );
    let v = x.json(A, Call::Drain { site, drain: true }).await.unwrap();
    assert_eq!(v["draining"], true, "{v}");
    let e = via_http(&x, A, &calls::DRAIN, &[("id", "no such!")], "", "")
        .await
        .unwrap_err();
    assert_eq!(e.field.as_deref(), Some("site"), "{e:?}");
}

pub(super) async fn report(x: Harness) {
    let v = x
        .json(A, Call::Report(wire(json!({"v": 1}))))
        .await
        .unwrap();
    assert!(v.is_object(), "{v}");
    let reporter = token(&x, Some("team-b"), &["report"]).await;
    let other = Call::Report(wire(json!({"v": 1, "tenant": "team-a"})));
    assert_eq!(
        code(x.json(Some(&reporter), other).await),
        ErrorCode::Forbidden
    );
    let watcher = token(&x, Some("team-b"), &["watch"]).await;
    let own = Call::Report(wire(json!({"v": 1})));
    assert_eq!(
        code(x.json(Some(&watcher), own).await),
        ErrorCode::Forbidden
    );
}

pub(super) async fn history(x: Harness) {
    let id = submit_one(&x, "h-1").await;
    let v = x
        .json(A, Call::History(wire(json!({"v": 1}))))
        .await
        .unwrap();
    assert_eq!(v["jobs"][0]["job"], id.as_str(), "{v}");
    let tenant = token(&x, Some("team-a"), &["watch"]).await;
    let call = Call::History(wire(json!({"v": 1})));
    assert_eq!(
        code(x.json(Some(&tenant), call).await),
        ErrorCode::Forbidden
    );
}

pub(super) async fn tenancy(x: Harness) {
    x.json(A, Call::Tenancy).await.unwrap();
    let tenant = token(&x, Some("team-a"), &["watch"]).await;
    assert_eq!(
        code(x.json(Some(&tenant), Call::Tenancy).await),
        ErrorCode::Forbidden
    );
}

pub(super) async fn set_tenancy(x: Harness) {
    let toml =
        "[[queues]]\nname = \"team-a\"\ntenant = \"team-a\"\n[queues.quota]\n\"gpu:A100\" = 2\n";
    let v = x.json(A, Call::SetTenancy(toml.into())).await.unwrap();
    assert_eq!(v["toml"], toml, "{v}");
    let tenant = token(&x, Some("team-a"), &["submit"]).await;
    let call = Call::SetTenancy(String::new());
    assert_eq!(
        code(x.json(Some(&tenant), call).await),
        ErrorCode::Forbidden
    );
    let e = x
        .json(A, Call::SetTenancy("[[queues]]\nname = 3".into()))
        .await
        .unwrap_err();
    assert_eq!(e.code, ErrorCode::Invalid, "{e:?}");
}

pub(super) async fn format(x: Harness) {
    let v = x.json(A, Call::Format).await.unwrap();
    assert_eq!(v["newest"], meridian_core::durable::FORMAT_VERSION, "{v}");
    let tenant = token(&x, Some("team-a"), &["watch"]).await;
    assert_eq!(
        code(x.json(Some(&tenant), Call::Format).await),
        ErrorCode::Forbidden
    );
}

pub(super) async fn upgrade_format(x: Harness) {
    let v = x.json(A, Call::UpgradeFormat).await.unwrap();
    assert_eq!(v["format"], v["newest"], "{v}");
    let viewer = token(&x, None, &["viewer"]).await;
    assert_eq!(
        code(x.json(Some(&viewer), Call::UpgradeFormat).await),
        ErrorCode::Forbidden
    );
}

pub(super) async fn quarantine(x: Harness) {
    let e = x.json(A, Call::Quarantine(7)).await.unwrap_err();
    assert_eq!(
        (e.code, e.field.as_deref()),
        (ErrorCode::Conflict, Some("seq"))
    );
    let viewer = token(&x, None, &["viewer"]).await;
    assert_eq!(
        code(x.json(Some(&viewer), Call::Quarantine(7)).await),
        ErrorCode::Forbidden
    );
    let e = via_http(&x, A, &calls::QUARANTINE, &[("seq", "seven")], "", "")
        .await
        .unwrap_err();
    assert_eq!(e.field.as_deref(), Some("seq"), "{e:?}");
}

pub(super) async fn token_create(x: Harness) {
    let made = token(&x, Some("team-a"), &["submit"]).await;
    assert!(made.starts_with("mrd_"), "{made}");
    let req = || wire(json!({"v": 1, "tenant": "team-a", "roles": ["submit"]}));
    assert_eq!(
        code(x.json(Some(&made), Call::TokenCreate(req())).await),
        ErrorCode::Forbidden
    );
    let bad = wire(json!({"v": 1, "tenant": "team-a", "roles": ["sudo"]}));
    let e = x.json(A, Call::TokenCreate(bad)).await.unwrap_err();
    assert_eq!(e.field.as_deref(), Some("roles"), "{e:?}");
}

pub(super) async fn token_list(x: Harness) {
    let made = token(&x, Some("team-a"), &["watch"]).await;
    let v = x.json(A, Call::TokenList).await.unwrap();
    assert_eq!(v.as_array().unwrap().len(), 1, "{v}");
    assert!(
        !v.to_string().contains(&made[made.len() - 8..]),
        "no secret shown"
    );
    assert_eq!(
        code(x.json(Some(&made), Call::TokenList).await),
        ErrorCode::Forbidden
    );
}

pub(super) async fn token_revoke(x: Harness) {
    let made = token(&x, Some("team-a"), &["watch"]).await;
    let id = made.split('_').nth(1).unwrap().to_owned();
    assert_eq!(
        code(x.json(Some(&made), Call::TokenRevoke(id.clone())).await),
        ErrorCode::Forbidden
    );
    let v = x.json(A, Call::TokenRevoke(id)).await.unwrap();
    assert_eq!(v["revoked"], true, "{v}");
    assert_eq!(
        code(
            x.json(Some(&made), Call::ListSites(Default::default()))
                .await
        ),
        ErrorCode::Unauthenticated
    );
}

pub(super) async fn site_revoke(x: Harness) {
    let site = || SiteId::new("site-b").unwrap();
    let tenant = token(&x, Some("team-a"), &["submit"]).await;
    assert_eq!(
        code(x.json(Some(&tenant), Call::SiteRevoke(site())).await),
        ErrorCode::Forbidden
    );
    x.json(A, Call::SiteRevoke(site())).await.unwrap();
    let sites = x
        .json(A, Call::ListSites(Default::default()))
        .await
        .unwrap();
    let b = sites
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["site"] == "site-b")
        .unwrap();
    assert_eq!(b["up"], false, "{b}");
}

pub(super) async fn site_restore(x: Harness) {
    let site = || SiteId::new("site-b").unwrap();
    x.json(A, Call::SiteRevoke(site())).await.unwrap();
    let tenant = token(&x, Some("team-a"), &["submit"]).await;
    assert_eq!(
        code(x.json(Some(&tenant), Call::SiteRestore(site())).await),
        ErrorCode::Forbidden
    );
    x.json(A, Call::SiteRestore(site())).await.unwrap();
}

pub(super) async fn audit(x: Harness) {
    let tenant = token(&x, Some("team-a"), &["watch"]).await;
    let refused = x.json(Some(&tenant), Call::TokenList).await;
    assert_eq!(code(refused), ErrorCode::Forbidden);
    let call = || Call::Audit(wire(json!({"v": 1})));
    assert_eq!(
        code(x.json(Some(&tenant), call()).await),
        ErrorCode::Forbidden
    );
    // The audit is written off the caller's path: wait for the refusals to be kept.
    let mut v = Value::Null;
    for _ in 0..100 {
        v = x.json(A, call()).await.unwrap();
        if v.to_string().contains("token_list") {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let entries = v["entries"].as_array().unwrap();
    assert!(entries.iter().any(|e| e["action"] == "token_create"), "{v}");
    assert!(
        entries.iter().any(|e| e["action"] == "token_list"
            && e["outcome"].as_str().unwrap().starts_with("refused")),
        "{v}"
    );
}

pub(super) async fn metrics(x: Harness) {
    let reply = x.call(A, Call::Metrics).await.unwrap();
    assert!(String::from_utf8_lossy(&reply.body).contains("meridian_"));
    let tenant = token(&x, Some("team-a"), &["watch"]).await;
    let e = x.call(Some(&tenant), Call::Metrics).await.unwrap_err();
    assert_eq!(e.0.code, ErrorCode::Forbidden);
}

pub(super) async fn session(x: Harness) {
    let tenant = token(&x, Some("team-a"), &["watch"]).await;
    let v = x.json(Some(&tenant), Call::Session).await.unwrap();
    assert_eq!(
        (v["tenant"].as_str(), v["admin"].as_bool()),
        (Some("team-a"), Some(false))
    );
    assert_eq!(
        code(x.json(Some("mrd_x_y"), Call::Session).await),
        ErrorCode::Unauthenticated
    );
}

pub(super) async fn version(x: Harness) {
    let tenant = token(&x, Some("team-a"), &["watch"]).await;
    let v = x.json(Some(&tenant), Call::Version).await.unwrap();
    assert_eq!(v["version"], env!("CARGO_PKG_VERSION"), "{v}");
    assert_eq!(v["wire"], meridian_federation::WIRE_VERSION);
    assert_eq!(
        code(x.json(None, Call::Version).await),
        ErrorCode::Unauthenticated
    );
}
