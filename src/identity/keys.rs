//! JWT verification keys (`identity.key_file` or `identity.jwks_file`), loaded into what `ring`
//! verifies with: an HS256 secret, an RSA public key's modulus and exponent, or a P-256 point.
//!
//! Formats: a PEM `PUBLIC KEY` (SubjectPublicKeyInfo, RSA or P-256) or `RSA PUBLIC KEY` (PKCS#1),
//! a raw secret file for HS256, or a JWKS document (`kty` RSA, EC P-256 or oct). The DER is read
//! by the few lines below, strictly: one structure, nothing after it. Pure: the caller reads the
//! file.

use base64::Engine as _;

use super::JwtAlgorithm;

/// One verification key and what it verifies.
pub struct Key {
    pub kid: Option<String>,
    pub alg: JwtAlgorithm,
    pub material: Material,
}

pub enum Material {
    Hmac(ring::hmac::Key),
    /// Big-endian modulus (no leading zero) and exponent.
    Rsa {
        n: Vec<u8>,
        e: Vec<u8>,
    },
    /// The uncompressed point `04 || x || y`.
    P256(Vec<u8>),
}

/// The smallest RSA modulus accepted, in bytes (2048 bits, as `ring` verifies).
const MIN_RSA_BYTES: usize = 256;

/// The smallest HS256 secret, in bytes.
const MIN_SECRET_BYTES: usize = 32;

/// The key of a `key_file` for `alg`.
pub fn from_file(bytes: &[u8], alg: JwtAlgorithm) -> Result<Key, String> {
    let material = match alg {
        JwtAlgorithm::HS256 => hmac(trim_secret(bytes))?,
        JwtAlgorithm::RS256 => {
            let (label, der) = pem(bytes)?;
            let (n, e) = match label.as_str() {
                "PUBLIC KEY" => match spki(&der)? {
                    Spki::Rsa(n, e) => (n, e),
                    Spki::P256(_) => return Err("an EC key, not an RSA key".into()),
                },
                "RSA PUBLIC KEY" => rsa_public_key(&der)?,
                other => return Err(format!("a PEM `{other}`, not a public key")),
            };
            rsa(n, e)?
        }
        JwtAlgorithm::ES256 => {
            let (label, der) = pem(bytes)?;
            if label != "PUBLIC KEY" {
                return Err(format!("a PEM `{label}`, not a public key"));
            }
            match spki(&der)? {
                Spki::P256(point) => Material::P256(point),
                Spki::Rsa(..) => return Err("an RSA key, not an EC key".into()),
            }
        }
    };
    Ok(Key {
        kid: None,
        alg,
        material,
    })
}

/// The signature keys of a JWKS document. Keys meant for something else (`use` other than
/// `sig`, `key_ops` without `verify`) and keys of other types or algorithms are left out.
pub fn from_jwks(bytes: &[u8]) -> Result<Vec<Key>, String> {
    #[derive(serde::Deserialize)]
    struct Set {
        keys: Vec<serde_json::Map<String, serde_json::Value>>,
    }
    let set: Set =
        serde_json::from_slice(bytes).map_err(|e| format!("not a JWKS document: {e}"))?;
    let mut keys = Vec::new();
    for jwk in &set.keys {
        let text = |name: &str| jwk.get(name).and_then(|v| v.as_str());
        let for_signatures = text("use").is_none_or(|u| u == "sig")
            && jwk.get("key_ops").is_none_or(|ops| {
                ops.as_array()
                    .is_some_and(|ops| ops.iter().any(|o| o.as_str() == Some("verify")))
            });
        if !for_signatures {
            continue;
        }
        let kid = text("kid").map(String::from);
        let b64 = |name: &str| -> Result<Vec<u8>, String> {
            let v = text(name).ok_or_else(|| format!("a key without `{name}`"))?;
            base64::engine::general_purpose::URL_SAFE_NO_PAD
                .decode(v.trim_end_matches('='))
                .map_err(|e| format!("`{name}` is not base64url: {e}"))
        };
        let (alg, material) = match (text("kty"), text("alg")) {
            (Some("RSA"), None | Some("RS256")) => {
                (JwtAlgorithm::RS256, rsa(b64("n")?, b64("e")?)?)
            }
            (Some("EC"), None | Some("ES256")) => {
                if text("crv") != Some("P-256") {
                    continue;
                }
                let (x, y) = (b64("x")?, b64("y")?);
                if x.len() != 32 || y.len() != 32 {
                    return Err("a P-256 key whose x or y is not 32 bytes".into());
                }
                let mut point = vec![4u8];
                point.extend_from_slice(&x);
                point.extend_from_slice(&y);
                (JwtAlgorithm::ES256, Material::P256(point))
            }
            (Some("oct"), None | Some("HS256")) => (JwtAlgorithm::HS256, hmac(&b64("k")?)?),
            // Another type or algorithm: not one this gateway verifies.
            _ => continue,
        };
        keys.push(Key { kid, alg, material });
    }
    Ok(keys)
}

fn hmac(secret: &[u8]) -> Result<Material, String> {
    if secret.len() < MIN_SECRET_BYTES {
        return Err(format!(
            "an HS256 secret must be at least {MIN_SECRET_BYTES} bytes"
        ));
    }
    Ok(Material::Hmac(ring::hmac::Key::new(
        ring::hmac::HMAC_SHA256,
        secret,
    )))
}

fn rsa(n: Vec<u8>, e: Vec<u8>) -> Result<Material, String> {
    let n = strip_zeros(n);
    if n.len() < MIN_RSA_BYTES {
        return Err("an RSA key must have at least 2048 bits".into());
    }
    let e = strip_zeros(e);
    if e.is_empty() || e.len() > 4 {
        return Err("an RSA exponent out of range".into());
    }
    Ok(Material::Rsa { n, e })
}

fn strip_zeros(mut v: Vec<u8>) -> Vec<u8> {
    let zeros = v.iter().take_while(|&&b| b == 0).count();
    v.drain(..zeros);
    v
}

/// A secret file's content without a trailing newline.
pub fn trim_secret(bytes: &[u8]) -> &[u8] {
    let mut end = bytes.len();
    while end > 0 && matches!(bytes[end - 1], b'\n' | b'\r') {
        end -= 1;
    }
    &bytes[..end]
}

/// The label and DER of the one PEM block in `bytes`.
fn pem(bytes: &[u8]) -> Result<(String, Vec<u8>), String> {
    let text = std::str::from_utf8(bytes).map_err(|_| "not a PEM file".to_string())?;
    let begin = text.find("-----BEGIN ").ok_or("not a PEM file")?;
    let rest = &text[begin + 11..];
    let label_end = rest.find("-----").ok_or("a broken PEM header")?;
    let label = rest[..label_end].to_string();
    let body = &rest[label_end + 5..];
    let end_line = format!("-----END {label}-----");
    let end = body
        .find(&end_line)
        .ok_or("a PEM block without its END line")?;
    let b64: String = body[..end].chars().filter(|c| !c.is_whitespace()).collect();
    let der = base64::engine::general_purpose::STANDARD
        .decode(b64)
        .map_err(|e| format!("a PEM body that is not base64: {e}"))?;
    Ok((label, der))
}

enum Spki {
    Rsa(Vec<u8>, Vec<u8>),
    P256(Vec<u8>),
}

const OID_RSA: &[u8] = &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x01];
const OID_EC: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01];
const OID_P256: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07];

/// `SubjectPublicKeyInfo ::= SEQUENCE { SEQUENCE { algorithm OID, parameters }, BIT STRING }`.
fn spki(der: &[u8]) -> Result<Spki, String> {
    let bad = || "not a SubjectPublicKeyInfo".to_string();
    let (info, rest) = tlv(der, 0x30).ok_or_else(bad)?;
    if !rest.is_empty() {
        return Err(bad());
    }
    let (alg, rest) = tlv(info, 0x30).ok_or_else(bad)?;
    let (bits, rest) = tlv(rest, 0x03).ok_or_else(bad)?;
    if !rest.is_empty() {
        return Err(bad());
    }
    let key = match bits.split_first() {
        Some((0, key)) => key,
        _ => return Err(bad()),
    };
    let (oid, params) = tlv(alg, 0x06).ok_or_else(bad)?;
    if oid == OID_RSA {
        let (n, e) = rsa_public_key(key)?;
        Ok(Spki::Rsa(n, e))
    } else if oid == OID_EC {
        let (curve, _) = tlv(params, 0x06).ok_or_else(bad)?;
        if curve != OID_P256 {
            return Err("an EC key on a curve other than P-256".into());
        }
        if key.len() != 65 || key[0] != 4 {
            return Err("a P-256 key that is not an uncompressed point".into());
        }
        Ok(Spki::P256(key.to_vec()))
    } else {
        Err("a key of an unsupported type".into())
    }
}

/// `RSAPublicKey ::= SEQUENCE { modulus INTEGER, publicExponent INTEGER }`.
fn rsa_public_key(der: &[u8]) -> Result<(Vec<u8>, Vec<u8>), String> {
    let bad = || "not an RSA public key".to_string();
    let (seq, rest) = tlv(der, 0x30).ok_or_else(bad)?;
    if !rest.is_empty() {
        return Err(bad());
    }
    let (n, rest) = tlv(seq, 0x02).ok_or_else(bad)?;
    let (e, rest) = tlv(rest, 0x02).ok_or_else(bad)?;
    if !rest.is_empty() {
        return Err(bad());
    }
    Ok((n.to_vec(), e.to_vec()))
}

/// One DER element with tag `tag` at the start of `der`: its value and what follows it.
fn tlv(der: &[u8], tag: u8) -> Option<(&[u8], &[u8])> {
    let (&t, rest) = der.split_first()?;
    if t != tag {
        return None;
    }
    let (&first, rest) = rest.split_first()?;
    let (len, rest) = if first < 0x80 {
        (usize::from(first), rest)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 || rest.len() < n {
            return None;
        }
        let len = rest[..n]
            .iter()
            .fold(0usize, |l, &b| l << 8 | usize::from(b));
        (len, &rest[n..])
    };
    if rest.len() < len {
        return None;
    }
    Some(rest.split_at(len))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(name: &str) -> Vec<u8> {
        std::fs::read(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("tests/data/jwt")
                .join(name),
        )
        .unwrap()
    }

    #[test]
    fn pem_keys_load_for_their_algorithm_only() {
        let rsa = from_file(&data("rsa_a.pub"), JwtAlgorithm::RS256).unwrap();
        assert!(matches!(rsa.material, Material::Rsa { ref n, .. } if n.len() == 256));
        assert!(from_file(&data("rsa_a.pub"), JwtAlgorithm::ES256).is_err());
        let ec = from_file(&data("ec_a.pub"), JwtAlgorithm::ES256).unwrap();
        assert!(matches!(ec.material, Material::P256(ref p) if p.len() == 65));
        assert!(from_file(&data("ec_a.pub"), JwtAlgorithm::RS256).is_err());
        assert!(from_file(b"short\n", JwtAlgorithm::HS256).is_err());
        assert!(from_file(&data("hs256.secret"), JwtAlgorithm::HS256).is_ok());
        assert!(from_file(b"garbage", JwtAlgorithm::RS256).is_err());
    }

    #[test]
    fn jwks_keep_signature_keys_of_known_kinds() {
        let keys = from_jwks(&data("jwks_ab.json")).unwrap();
        let kids: Vec<_> = keys.iter().map(|k| k.kid.clone().unwrap()).collect();
        assert_eq!(kids, ["a", "b"]);
        let mixed = br#"{"keys":[
            {"kty":"EC","crv":"P-256","use":"enc","x":"hyQTWqrE-IbxMYTINUe5kU6cx1iLO1K37JCvS3lANAw","y":"wV5-4JX5v8NcJCnKMWehnOQyRUJ8im_nFXwPF3Y5JaQ"},
            {"kty":"OKP","crv":"Ed25519","x":"11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo"},
            {"kty":"RSA","alg":"RS512","n":"AQAB","e":"AQAB"}
        ]}"#;
        assert!(from_jwks(mixed).unwrap().is_empty());
        assert!(from_jwks(b"{not json").is_err());
    }

    #[test]
    fn der_lengths_are_checked() {
        assert_eq!(
            tlv(&[0x30, 0x02, 1, 2], 0x30),
            Some((&[1u8, 2][..], &[][..]))
        );
        assert_eq!(tlv(&[0x30, 0x03, 1, 2], 0x30), None);
        assert_eq!(
            tlv(&[0x30, 0x81, 0x01, 9], 0x30),
            Some((&[9u8][..], &[][..]))
        );
        assert_eq!(tlv(&[0x02, 0x01, 9], 0x30), None);
        assert_eq!(tlv(&[0x30, 0x85, 0, 0, 0, 0, 1], 0x30), None);
    }
}
