//! The federation's certificates: a CA of its own, a certificate for the servers (NATS and the HTTP API), and
//! a client certificate per identity for mutual TLS. Made with rcgen (ECDSA P-256); nothing here does
//! cryptography by hand.

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

/// A certificate and its private key, both PEM.
#[derive(Clone, Debug)]
pub struct Pem {
    pub cert: String,
    pub key: String,
}

#[derive(Debug, thiserror::Error)]
#[error("certificate: {0}")]
pub struct PkiError(#[from] rcgen::Error);

/// Validity: from a day ago for `years`.
fn validity(p: &mut CertificateParams, years: i64) {
    let now = time_now();
    p.not_before = now - time::Duration::days(1);
    p.not_after = now + time::Duration::days(365 * years);
}

fn time_now() -> time::OffsetDateTime {
    #[allow(clippy::disallowed_methods)]
    // a certificate's validity starts from the moment it is made
    time::OffsetDateTime::now_utc()
}

/// A new CA.
pub fn new_ca(name: &str) -> Result<Pem, PkiError> {
    let key = KeyPair::generate()?;
    let mut p = CertificateParams::new(Vec::<String>::new())?;
    p.distinguished_name
        .push(DnType::CommonName, format!("{name} CA"));
    p.distinguished_name
        .push(DnType::OrganizationName, "Meridian federation");
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    validity(&mut p, 10);
    let cert = p.self_signed(&key)?;
    Ok(Pem {
        cert: cert.pem(),
        key: key.serialize_pem(),
    })
}

/// What a certificate is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Usage {
    /// A server that clients verify (and that also dials its peers: cluster routes, leaf connections).
    Server,
    /// A client presenting itself (mutual TLS).
    Client,
}

/// A certificate for `name`, signed by the CA, valid for the host names and addresses in `hosts`.
pub fn issue(ca: &Pem, name: &str, hosts: &[String], usage: Usage) -> Result<Pem, PkiError> {
    let ca_key = KeyPair::from_pem(&ca.key)?;
    let issuer = Issuer::from_ca_cert_pem(&ca.cert, ca_key)?;
    let key = KeyPair::generate()?;
    let mut p = CertificateParams::new(hosts.to_vec())?;
    p.distinguished_name.push(DnType::CommonName, name);
    p.use_authority_key_identifier_extension = true;
    p.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    p.extended_key_usages = match usage {
        // Servers dial each other (routes, leaf nodes) with the same certificate.
        Usage::Server => vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ],
        Usage::Client => vec![ExtendedKeyUsagePurpose::ClientAuth],
    };
    validity(&mut p, 2);
    let cert = p.signed_by(&key, &issuer)?;
    Ok(Pem {
        cert: cert.pem(),
        key: key.serialize_pem(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn issued_certificates_name_their_holder_and_hosts() {
        let ca = new_ca("test").unwrap_or_else(|e| panic!("{e}"));
        assert!(ca.cert.contains("BEGIN CERTIFICATE") && ca.key.contains("PRIVATE KEY"));
        let hosts = vec!["127.0.0.1".to_owned(), "localhost".to_owned()];
        let server = issue(&ca, "nats", &hosts, Usage::Server).unwrap_or_else(|e| panic!("{e}"));
        let client = issue(&ca, "site-a", &[], Usage::Client).unwrap_or_else(|e| panic!("{e}"));
        assert_ne!(server.cert, client.cert);
        assert_ne!(server.key, ca.key);
    }
}
