//! The layer's own answers: RFC 9457 problem details, as the draft's
//! error scenarios show them.

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};
use http_body_util::{BodyExt, Full};

use crate::ResponseBody;

/// A request the layer answers itself, without running the handler.
#[derive(Debug)]
pub(crate) struct Refusal {
    status: StatusCode,
    title: &'static str,
    detail: String,
}

impl Refusal {
    pub(crate) fn new(status: StatusCode, title: &'static str, detail: String) -> Refusal {
        Refusal {
            status,
            title,
            detail,
        }
    }

    /// 400: the `Idempotency-Key` field `what`.
    pub(crate) fn bad_key(what: &str) -> Refusal {
        Refusal::new(
            StatusCode::BAD_REQUEST,
            "Invalid Idempotency-Key",
            format!("the Idempotency-Key request header {what}"),
        )
    }

    pub(crate) fn into_response(self) -> Response<ResponseBody> {
        let body = serde_json::json!({
            "type": "about:blank",
            "title": self.title,
            "status": self.status.as_u16(),
            "detail": self.detail,
        });
        let mut res = Response::new(
            Full::new(Bytes::from(body.to_string()))
                .map_err(|never| match never {})
                .boxed_unsync(),
        );
        *res.status_mut() = self.status;
        res.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        res
    }
}
