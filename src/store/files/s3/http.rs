//! The S3 client's HTTP: hyper-util's client over rustls with ring, as
//! the rest of the daemon's TLS, given to object_store as its
//! [`HttpConnector`] (object_store's own would bring reqwest's rustls with
//! a crypto provider every client of the process must install first).

use std::time::Duration;

use async_trait::async_trait;
use http_body_util::BodyExt;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector as TcpConnector;
use hyper_util::rt::TokioExecutor;
use object_store::client::{
    ClientOptions, HttpClient, HttpConnector, HttpError, HttpErrorKind, HttpRequest,
    HttpRequestBody, HttpResponse, HttpResponseBody, HttpService,
};

/// How long a connection may take to open.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// How long one request may take until its response's head: a part of a
/// multipart upload is at most a few MiB.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(120);

type Inner = Client<hyper_rustls::HttpsConnector<TcpConnector>, HttpRequestBody>;

/// Connects object_store's S3 client through hyper.
#[derive(Debug, Clone)]
pub struct Connector(Inner);

impl Connector {
    /// A client for `http://` and `https://` endpoints, trusting the
    /// system's roots.
    pub fn new() -> Result<Self, String> {
        let mut tcp = TcpConnector::new();
        tcp.enforce_http(false);
        tcp.set_connect_timeout(Some(CONNECT_TIMEOUT));
        tcp.set_nodelay(true);
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_provider_and_native_roots(rustls::crypto::ring::default_provider())
            .map_err(|e| format!("cannot read the system's TLS roots: {e}"))?
            .https_or_http()
            .enable_http1()
            .enable_http2()
            .wrap_connector(tcp);
        Ok(Self(
            Client::builder(TokioExecutor::new())
                .pool_idle_timeout(Duration::from_secs(30))
                .build(https),
        ))
    }
}

impl HttpConnector for Connector {
    fn connect(&self, _options: &ClientOptions) -> object_store::Result<HttpClient> {
        Ok(HttpClient::new(self.clone()))
    }
}

#[async_trait]
impl HttpService for Connector {
    async fn call(&self, request: HttpRequest) -> Result<HttpResponse, HttpError> {
        let response = tokio::time::timeout(REQUEST_TIMEOUT, self.0.request(request))
            .await
            .map_err(|elapsed| HttpError::new(HttpErrorKind::Timeout, elapsed))?
            .map_err(|error| {
                let kind = if error.is_connect() {
                    HttpErrorKind::Connect
                } else {
                    HttpErrorKind::Request
                };
                HttpError::new(kind, error)
            })?;
        let (parts, body) = response.into_parts();
        let body = body.map_err(|error| HttpError::new(HttpErrorKind::Interrupted, error));
        Ok(HttpResponse::from_parts(parts, HttpResponseBody::new(body)))
    }
}
