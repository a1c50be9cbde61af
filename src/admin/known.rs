//! An API key given to the support API by its digest (`sha256:…`, as
//! every answer, table, log line and `/admin/top` shows one), made the
//! key again from what the gateway knows, so a caller seen only by its
//! digest can be looked up, reset and overridden.

use super::request::{BadField, CallerFields, bad};
use crate::identity;
use crate::pipeline::Gateway;

/// The clear API key that `fields.api_key` names when it is written as
/// its digest (`sha256:…`, as every answer shows it): a static key of
/// `api_keys.keys`, an exempt key, the key of an override, or the key of
/// an identity `/admin/top` holds now.
///
/// # Errors
/// A digest of no key this gateway knows.
pub fn known_key(gw: &Gateway, fields: &mut CallerFields) -> Result<(), BadField> {
    let Some(given) = fields.api_key.as_deref().filter(|k| identity::is_digest(k)) else {
        return Ok(());
    };
    let is = |k: &[u8]| identity::digest(k) == given;
    let configured = gw.with_config(|c| {
        let statics = c.api_keys.keys.keys().map(|k| k.as_bytes().to_vec());
        let exempts = c.routes.iter().filter_map(|r| r.exempt.as_ref());
        let exempts = exempts.chain(c.exempt.as_ref());
        let exempt_keys = exempts.flat_map(|e| e.api_keys.iter().map(|k| k.to_vec()));
        statics.chain(exempt_keys).find(|k| is(k))
    });
    let overridden = || {
        let all = gw.overrides().all();
        all.iter()
            .filter(|o| o.subject.field == "api_key")
            .map(|o| o.subject.value.as_bytes().to_vec())
            .find(|k| is(k))
    };
    let seen = || gw.top().api_key(given).map(Vec::from);
    let Some(key) = configured.or_else(overridden).or_else(seen) else {
        return Err(bad(
            "api_key",
            format!(
                "{given} is the digest of no API key this gateway knows (static and exempt \
                 keys, overrides, /admin/top); give the key itself"
            ),
        ));
    };
    match String::from_utf8(key) {
        Ok(k) => fields.api_key = Some(k),
        Err(_) => return Err(bad("api_key", "the key of that digest is not text")),
    }
    Ok(())
}
