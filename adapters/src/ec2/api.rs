//! A small EC2 Query API client: form-encoded `POST`s signed with AWS Signature Version 4 (the `aws-sigv4`
//! crate, AWS's own signer), sent with the blocking HTTP client already in the tree, answers read as XML.
//!
//! Only what the EC2 backend uses is here. The official SDK would do the same with about 90 MB of
//! generated source, a newer compiler than the workspace declares and many minutes of build on two cores.

#![allow(clippy::disallowed_methods)] // I/O at the edge: a request is signed at the time it is sent

use std::time::{Duration, SystemTime};

/// The EC2 API version every call names.
const VERSION: &str = "2016-11-15";

/// An EC2 call that failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Ec2Error {
    /// EC2 answered with an error code (`InsufficientInstanceCapacity`, `VcpuLimitExceeded`, …).
    #[error("{code}: {message}")]
    Api { code: String, message: String },
    /// The request did not reach EC2, or its answer did not come back.
    #[error("EC2 endpoint unreachable: {0}")]
    Transport(String),
    /// EC2's answer could not be read.
    #[error("EC2 answer unreadable: {0}")]
    Unreadable(String),
}

impl Ec2Error {
    pub fn code(&self) -> Option<&str> {
        match self {
            Ec2Error::Api { code, .. } => Some(code),
            _ => None,
        }
    }
}

/// AWS credentials: from `AWS_ACCESS_KEY_ID`/`AWS_SECRET_ACCESS_KEY`/`AWS_SESSION_TOKEN`, else the shared
/// credentials file (`AWS_SHARED_CREDENTIALS_FILE`, default `~/.aws/credentials`, profile `AWS_PROFILE` or
/// `default`).
#[derive(Clone)]
pub struct Credentials {
    pub access_key: String,
    pub secret_key: String,
    pub session_token: Option<String>,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Credentials({}, <secret>)", self.access_key)
    }
}

impl Credentials {
    pub fn from_environment() -> Result<Self, String> {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        if let (Some(access_key), Some(secret_key)) =
            (var("AWS_ACCESS_KEY_ID"), var("AWS_SECRET_ACCESS_KEY"))
        {
            return Ok(Credentials {
                access_key,
                secret_key,
                session_token: var("AWS_SESSION_TOKEN"),
            });
        }
        let path = var("AWS_SHARED_CREDENTIALS_FILE")
            .map(std::path::PathBuf::from)
            .or_else(|| var("HOME").map(|h| std::path::Path::new(&h).join(".aws/credentials")))
            .ok_or("no AWS credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY")?;
        let profile = var("AWS_PROFILE").unwrap_or_else(|| "default".into());
        let text = std::fs::read_to_string(&path).map_err(|e| {
            format!(
                "no AWS credentials: AWS_ACCESS_KEY_ID is not set and {} cannot be read: {e}",
                path.display()
            )
        })?;
        Self::from_profile(&text, &profile).ok_or_else(|| {
            format!(
                "{}: no profile [{profile}] with aws_access_key_id and aws_secret_access_key",
                path.display()
            )
        })
    }

    /// The keys of one profile of a shared credentials file (INI).
    pub fn from_profile(text: &str, profile: &str) -> Option<Self> {
        let mut in_profile = false;
        let (mut ak, mut sk, mut token) = (None, None, None);
        for line in text.lines().map(str::trim) {
            if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
                in_profile = name.trim() == profile;
                continue;
            }
            let Some((k, v)) = line.split_once('=') else {
                continue;
            };
            if !in_profile {
                continue;
            }
            let v = v.trim().to_owned();
            match k.trim() {
                "aws_access_key_id" => ak = Some(v),
                "aws_secret_access_key" => sk = Some(v),
                "aws_session_token" => token = Some(v),
                _ => {}
            }
        }
        Some(Credentials {
            access_key: ak?,
            secret_key: sk?,
            session_token: token,
        })
    }
}

/// A request to sign.
pub struct ToSign<'a> {
    pub method: &'a str,
    pub url: &'a str,
    pub headers: &'a [(&'a str, &'a str)],
    pub body: &'a [u8],
}

/// The signature headers (`authorization`, `x-amz-date`, …) for one request to `service` in `region`.
pub fn signature_headers(
    creds: &Credentials,
    region: &str,
    service: &str,
    r: &ToSign<'_>,
    at: SystemTime,
) -> Result<Vec<(String, String)>, String> {
    use aws_sigv4::http_request::{sign, SignableBody, SignableRequest, SigningSettings};
    let identity = aws_credential_types::Credentials::new(
        &creds.access_key,
        &creds.secret_key,
        creds.session_token.clone(),
        None,
        "meridian",
    )
    .into();
    let params = aws_sigv4::sign::v4::SigningParams::builder()
        .identity(&identity)
        .region(region)
        .name(service)
        .time(at)
        .settings(SigningSettings::default())
        .build()
        .map_err(|e| format!("signing parameters: {e}"))?
        .into();
    let request = SignableRequest::new(
        r.method,
        r.url,
        r.headers.iter().copied(),
        SignableBody::Bytes(r.body),
    )
    .map_err(|e| format!("signing: {e}"))?;
    let (instructions, _) = sign(request, &params)
        .map_err(|e| format!("signing: {e}"))?
        .into_parts();
    Ok(instructions
        .headers()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect())
}

/// One EC2 API endpoint per region (or one for all, for compatible clouds and tests).
pub struct Client {
    /// `None`: `https://ec2.<region>.amazonaws.com/`.
    endpoint: Option<String>,
    creds: Credentials,
    http: ureq::Agent,
}

impl Client {
    pub fn new(endpoint: Option<String>, creds: Credentials) -> Self {
        let http = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(10)))
            .build()
            .into();
        Client {
            endpoint,
            creds,
            http,
        }
    }

    fn url(&self, region: &str) -> String {
        match &self.endpoint {
            Some(e) => e.clone(),
            None => format!("https://ec2.{region}.amazonaws.com/"),
        }
    }

    /// Makes one call; its answer's XML text.
    pub fn call(
        &self,
        region: &str,
        action: &str,
        params: &[(String, String)],
    ) -> Result<String, Ec2Error> {
        let mut form = form_urlencoded::Serializer::new(String::new());
        form.append_pair("Action", action)
            .append_pair("Version", VERSION);
        for (k, v) in params {
            form.append_pair(k, v);
        }
        let body = form.finish();
        let url = self.url(region);
        let content_type = "application/x-www-form-urlencoded; charset=utf-8";
        let signed = signature_headers(
            &self.creds,
            region,
            "ec2",
            &ToSign {
                method: "POST",
                url: &url,
                headers: &[("content-type", content_type)],
                body: body.as_bytes(),
            },
            SystemTime::now(),
        )
        .map_err(Ec2Error::Transport)?;
        let mut req = self.http.post(&url).header("content-type", content_type);
        for (k, v) in &signed {
            req = req.header(k.as_str(), v.as_str());
        }
        let mut reply = req
            .send(body.as_str())
            .map_err(|e| Ec2Error::Transport(format!("{action} in {region}: {e}")))?;
        let status = reply.status().as_u16();
        let text = reply
            .body_mut()
            .read_to_string()
            .map_err(|e| Ec2Error::Transport(format!("{action} in {region}: {e}")))?;
        if status >= 400 {
            return Err(parse_error(&text).unwrap_or(Ec2Error::Api {
                code: format!("HTTP{status}"),
                message: text.chars().take(200).collect(),
            }));
        }
        Ok(text)
    }
}

/// EC2's error body: `<Response><Errors><Error><Code>…</Code><Message>…</Message></Error></Errors>…`.
pub fn parse_error(xml: &str) -> Option<Ec2Error> {
    let doc = roxmltree::Document::parse(xml).ok()?;
    let error = doc.descendants().find(|n| n.has_tag_name("Error"))?;
    let text = |name: &str| {
        error
            .children()
            .find(|n| n.has_tag_name(name))
            .and_then(|n| n.text())
            .unwrap_or("")
            .to_owned()
    };
    Some(Ec2Error::Api {
        code: text("Code"),
        message: text("Message"),
    })
}

/// What `DescribeInstanceTypes` says of a type's GPUs.
#[derive(Clone, Debug, PartialEq)]
pub struct InstanceType {
    pub name: String,
    pub gpu_name: String,
    pub gpu_manufacturer: String,
    pub gpus: u32,
    pub gpu_memory_mib: u64,
    pub vcpus: u32,
    pub memory_mib: u64,
}

/// One instance as `DescribeInstances` or `RunInstances` reports it.
#[derive(Clone, Debug, PartialEq)]
pub struct Instance {
    pub id: String,
    /// `pending`, `running`, `shutting-down`, `terminated`, `stopping`, `stopped`.
    pub state: String,
    pub instance_type: String,
    pub zone: String,
    pub spot: bool,
    pub private_ip: Option<String>,
    pub tags: Vec<(String, String)>,
}

impl Instance {
    pub fn tag(&self, key: &str) -> Option<&str> {
        self.tags
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// Whether it is gone or going (terminated, or shut down).
    pub fn gone(&self) -> bool {
        matches!(
            self.state.as_str(),
            "shutting-down" | "terminated" | "stopping" | "stopped"
        )
    }
}

fn child_text<'a>(n: roxmltree::Node<'a, '_>, name: &str) -> Option<&'a str> {
    n.children()
        .find(|c| c.has_tag_name(name))
        .and_then(|c| c.text())
}

fn child<'a, 'i>(n: roxmltree::Node<'a, 'i>, name: &str) -> Option<roxmltree::Node<'a, 'i>> {
    n.children().find(|c| c.has_tag_name(name))
}

fn items<'a, 'i>(n: roxmltree::Node<'a, 'i>) -> impl Iterator<Item = roxmltree::Node<'a, 'i>> {
    n.children().filter(|c| c.has_tag_name("item"))
}

fn parse(xml: &str) -> Result<roxmltree::Document<'_>, Ec2Error> {
    roxmltree::Document::parse(xml).map_err(|e| Ec2Error::Unreadable(e.to_string()))
}

/// The GPU instance types of a `DescribeInstanceTypes` answer (types without GPUs are left out).
pub fn parse_instance_types(xml: &str) -> Result<Vec<InstanceType>, Ec2Error> {
    let doc = parse(xml)?;
    let mut out = Vec::new();
    let Some(set) = doc
        .descendants()
        .find(|n| n.has_tag_name("instanceTypeSet"))
    else {
        return Ok(out);
    };
    for item in items(set) {
        let name = child_text(item, "instanceType").unwrap_or("").to_owned();
        let Some(gpu) = child(item, "gpuInfo")
            .and_then(|g| child(g, "gpus"))
            .and_then(|g| items(g).next())
        else {
            continue;
        };
        let num = |n: Option<&str>| n.and_then(|t| t.parse::<u64>().ok()).unwrap_or(0);
        out.push(InstanceType {
            gpu_name: child_text(gpu, "name").unwrap_or("").to_owned(),
            gpu_manufacturer: child_text(gpu, "manufacturer").unwrap_or("").to_owned(),
            gpus: num(child_text(gpu, "count")) as u32,
            gpu_memory_mib: num(child(gpu, "memoryInfo").and_then(|m| child_text(m, "sizeInMiB"))),
            vcpus: num(child(item, "vCpuInfo").and_then(|m| child_text(m, "defaultVCpus"))) as u32,
            memory_mib: num(child(item, "memoryInfo").and_then(|m| child_text(m, "sizeInMiB"))),
            name,
        });
    }
    Ok(out)
}

/// The instances of a `DescribeInstances` or `RunInstances` answer.
pub fn parse_instances(xml: &str) -> Result<Vec<Instance>, Ec2Error> {
    let doc = parse(xml)?;
    let mut out = Vec::new();
    for set in doc.descendants().filter(|n| n.has_tag_name("instancesSet")) {
        for item in items(set) {
            let tags = child(item, "tagSet")
                .map(|t| {
                    items(t)
                        .map(|i| {
                            (
                                child_text(i, "key").unwrap_or("").to_owned(),
                                child_text(i, "value").unwrap_or("").to_owned(),
                            )
                        })
                        .collect()
                })
                .unwrap_or_default();
            out.push(Instance {
                id: child_text(item, "instanceId").unwrap_or("").to_owned(),
                state: child(item, "instanceState")
                    .and_then(|s| child_text(s, "name"))
                    .unwrap_or("")
                    .to_owned(),
                instance_type: child_text(item, "instanceType").unwrap_or("").to_owned(),
                zone: child(item, "placement")
                    .and_then(|p| child_text(p, "availabilityZone"))
                    .unwrap_or("")
                    .to_owned(),
                spot: child_text(item, "instanceLifecycle") == Some("spot"),
                private_ip: child_text(item, "privateIpAddress").map(str::to_owned),
                tags,
            });
        }
    }
    if out.iter().any(|i| i.id.is_empty()) {
        return Err(Ec2Error::Unreadable("an instance without an id".into()));
    }
    Ok(out)
}

/// The zone names of a `DescribeAvailabilityZones` answer that are available.
pub fn parse_zones(xml: &str) -> Result<Vec<String>, Ec2Error> {
    let doc = parse(xml)?;
    Ok(doc
        .descendants()
        .filter(|n| n.has_tag_name("item") && child(*n, "zoneName").is_some())
        .filter(|n| child_text(*n, "zoneState").is_none_or(|s| s == "available"))
        .filter_map(|n| child_text(n, "zoneName").map(str::to_owned))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// AWS's published Signature Version 4 test vector `get-vanilla` (service `service`, 2015-08-30T12:36:00Z).
    #[test]
    fn signs_like_the_published_vector() {
        let creds = Credentials {
            access_key: "AKIDEXAMPLE".into(),
            secret_key: "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY".into(),
            session_token: None,
        };
        let at = SystemTime::UNIX_EPOCH + Duration::from_secs(1_440_938_160);
        let headers = signature_headers(
            &creds,
            "us-east-1",
            "service",
            &ToSign {
                method: "GET",
                url: "https://example.amazonaws.com/",
                headers: &[("host", "example.amazonaws.com")],
                body: b"",
            },
            at,
        )
        .expect("signed");
        let auth = headers
            .iter()
            .find(|(k, _)| k == "authorization")
            .map(|(_, v)| v.as_str());
        assert_eq!(
            auth,
            Some(
                "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, \
                 SignedHeaders=host;x-amz-date, \
                 Signature=5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31"
            )
        );
    }

    #[test]
    fn reads_ec2_errors_and_profiles() {
        let xml = "<?xml version=\"1.0\"?><Response><Errors><Error><Code>InsufficientInstanceCapacity</Code>\
                   <Message>We currently do not have sufficient p5.48xlarge capacity</Message></Error></Errors>\
                   <RequestID>r</RequestID></Response>";
        let e = parse_error(xml).expect("an error");
        assert_eq!(e.code(), Some("InsufficientInstanceCapacity"));
        assert!(parse_error("not xml").is_none());
        let file = "[default]\naws_access_key_id = A\naws_secret_access_key = B\n[other]\naws_access_key_id = C\n";
        let c = Credentials::from_profile(file, "default").expect("default");
        assert_eq!((c.access_key.as_str(), c.secret_key.as_str()), ("A", "B"));
        assert!(
            Credentials::from_profile(file, "other").is_none(),
            "no secret key"
        );
    }

    #[test]
    fn reads_gpu_types_and_instances() {
        let xml = "<DescribeInstanceTypesResponse><instanceTypeSet>\
            <item><instanceType>m5.large</instanceType></item>\
            <item><instanceType>p4d.24xlarge</instanceType><vCpuInfo><defaultVCpus>96</defaultVCpus></vCpuInfo>\
            <memoryInfo><sizeInMiB>1179648</sizeInMiB></memoryInfo><gpuInfo><gpus><item><name>A100</name>\
            <manufacturer>NVIDIA</manufacturer><count>8</count><memoryInfo><sizeInMiB>40960</sizeInMiB>\
            </memoryInfo></item></gpus></gpuInfo></item></instanceTypeSet></DescribeInstanceTypesResponse>";
        let t = parse_instance_types(xml).expect("types");
        assert_eq!(t.len(), 1, "the type without GPUs is left out");
        assert_eq!(
            (t[0].gpu_name.as_str(), t[0].gpus, t[0].gpu_memory_mib),
            ("A100", 8, 40960)
        );
        let xml = "<R><reservationSet><item><instancesSet><item><instanceId>i-1</instanceId>\
            <instanceState><code>16</code><name>running</name></instanceState><instanceType>g5.xlarge</instanceType>\
            <placement><availabilityZone>us-east-1b</availabilityZone></placement>\
            <instanceLifecycle>spot</instanceLifecycle><tagSet><item><key>meridian:job</key><value>j1</value></item>\
            </tagSet></item></instancesSet></item></reservationSet></R>";
        let i = parse_instances(xml).expect("instances");
        assert_eq!(i[0].id, "i-1");
        assert_eq!(i[0].state, "running");
        assert!(i[0].spot && !i[0].gone());
        assert_eq!(i[0].tag("meridian:job"), Some("j1"));
    }
}
