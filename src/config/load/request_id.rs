//! `request_id: { header, keep_from }`: which header carries a request's
//! id, and from whom a client's is kept.

use super::check::{Check, Checked, choice, parse_header_name, text};
use super::header_rules::HOP_BY_HOP;
use crate::config::file;
use crate::config::position::child_key;
use crate::config::{KeepFrom, RequestIdConfig};

impl Check<'_> {
    /// `request_id: { header, keep_from }`.
    pub(super) fn request_id(
        &mut self,
        rid: &file::RequestId,
        path: &str,
    ) -> Checked<RequestIdConfig> {
        let header = self.optional(
            &rid.header,
            &child_key(path, "header"),
            text(parse_header_name),
        );
        let keep_from = self.optional(
            &rid.keep_from,
            &child_key(path, "keep_from"),
            choice(&KeepFrom::SPELLINGS),
        );
        let header = header?;
        if let Some(h) = &header
            && (h == http::header::HOST
                || h.as_str().starts_with("x-forwarded-")
                || HOP_BY_HOP.contains(&h.as_str()))
        {
            return Err(self.value_error(
                &child_key(path, "header"),
                format!("{h} is a header the gateway sets itself; name another, e.g. x-request-id"),
            ));
        }
        let defaults = RequestIdConfig::default();
        Ok(RequestIdConfig {
            header: header.unwrap_or(defaults.header),
            keep_from: keep_from?.unwrap_or(defaults.keep_from),
        })
    }
}
