//! The call table as docs/api.md shows it, and the checks that the table is whole: every NATS subject and
//! HTTP route declared once, reads and changes told apart, each decoder making its own call.

use super::calls::CALLS;

/// docs/api.md's table of calls, made from the table.
pub fn reference_markdown() -> String {
    let mut out =
        String::from("| HTTP | NATS `<call>` | who | body → reply |\n| --- | --- | --- | --- |\n");
    for def in CALLS {
        let http: Vec<String> = def
            .http
            .iter()
            .map(|r| format!("`{} {}`", format!("{:?}", r.method).to_uppercase(), r.path))
            .collect();
        let nats: Vec<String> = def.nats.iter().map(|(s, _)| format!("`{s}`")).collect();
        out.push_str(&format!(
            "| {} | {} | {} | {} |\n",
            if http.is_empty() {
                "—".into()
            } else {
                http.join(", ")
            },
            if nats.is_empty() {
                "—".into()
            } else {
                nats.join(", ")
            },
            def.access.who(),
            def.doc.replace('|', "\\|"),
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use crate::service::api::calls::{Access, HttpIn, Method, NatsIn};
    use bytes::Bytes;
    use meridian_federation::subjects::api as subject;
    use std::collections::BTreeSet;

    const BEGIN: &str = "<!-- calls: made by `MERIDIAN_WRITE_DOCS=1 cargo test -p meridian-broker --lib api_reference` -->\n";
    const END: &str = "<!-- /calls -->";

    /// docs/api.md's table of calls is the call table's.
    #[test]
    fn api_reference_is_current() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/api.md");
        let text = std::fs::read_to_string(&path).unwrap();
        let (head, rest) = text.split_once(BEGIN).expect("the table's start marker");
        let (_, tail) = rest.split_once(END).expect("the table's end marker");
        let made = format!("{head}{BEGIN}{}{END}{tail}", reference_markdown());
        if std::env::var_os("MERIDIAN_WRITE_DOCS").is_some() {
            std::fs::write(&path, &made).unwrap();
        }
        assert!(
            text == made,
            "docs/api.md's table differs from the call table: run MERIDIAN_WRITE_DOCS=1 cargo test -p \
             meridian-broker --lib api_reference"
        );
    }

    /// Every NATS subject the wire crate names is declared once, and nothing else is.
    #[test]
    fn every_nats_subject_is_declared_once() {
        let declared: Vec<&str> = CALLS
            .iter()
            .flat_map(|d| d.nats.iter().map(|(s, _)| *s))
            .collect();
        let set: BTreeSet<&str> = declared.iter().copied().collect();
        assert_eq!(set.len(), declared.len(), "a subject declared twice");
        let wire: BTreeSet<&str> = subject::CALLS.into_iter().collect();
        assert_eq!(set, wire);
    }

    /// Every route is declared once, and every call is in the table once.
    #[test]
    fn every_route_and_call_is_declared_once() {
        let routes: Vec<(Method, &str)> = CALLS
            .iter()
            .flat_map(|d| d.http.iter().map(|r| (r.method, r.path)))
            .collect();
        for (i, r) in routes.iter().enumerate() {
            assert!(!routes[..i].contains(r), "{r:?} twice");
        }
        for (i, d) in CALLS.iter().enumerate() {
            assert!(
                !CALLS[..i].iter().any(|e| std::ptr::eq(*e, *d)),
                "{} listed twice",
                d.action
            );
            assert!(!d.http.is_empty() || !d.nats.is_empty(), "{}", d.action);
        }
    }

    /// A change never rides a dashboard's session cookie: only reads may.
    #[test]
    fn only_reads_take_a_session_cookie() {
        for d in CALLS {
            let changes = matches!(
                d.access,
                Access::Change | Access::Admin(_) | Access::Gateway
            );
            assert_eq!(d.access.reads_only(), !changes, "{}", d.action);
            let http_reads = d.http.iter().all(|r| r.method == Method::Get);
            if d.access.reads_only() {
                assert!(http_reads, "{} reads over a method that changes", d.action);
            }
        }
    }

    /// Each edge decodes into the call its declaration says.
    #[test]
    fn each_decoder_makes_its_own_call() {
        let inbox = || crate::service::reply::Inbox::for_tests("_INBOX.operator.t");
        for d in CALLS {
            for (s, from) in d.nats {
                let Ok((call, _)) = from(NatsIn {
                    payload: Bytes::new(),
                    inbox: inbox(),
                }) else {
                    continue;
                };
                assert!(
                    std::ptr::eq(call.def(), *d) || call.def().nats.is_empty(),
                    "{s} made {call:?}"
                );
            }
            for r in d.http {
                let input = HttpIn {
                    params: [("id", "j-1"), ("name", "svc"), ("seq", "3")]
                        .into_iter()
                        .map(|(k, v)| (k.to_owned(), v.to_owned()))
                        .collect(),
                    uri: axum::http::Uri::from_static("/x?tenant=t"),
                    body: Bytes::new(),
                };
                if let Ok(call) = (r.decode)(input) {
                    assert!(std::ptr::eq(call.def(), *d), "{} made {call:?}", r.path);
                }
            }
        }
    }
}
