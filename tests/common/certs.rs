//! A test CA and a server certificate it signs, for the tests that run a TLS
//! server on loopback (Redis over TLS, an HTTPS upstream of the egress proxy).

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};

/// The CA's certificate and a server's certificate and key, PEM and DER.
pub struct TestCerts {
    pub ca_pem: String,
    pub server_pem: String,
    pub server_der: Vec<u8>,
    pub key_pem: String,
    pub key_der: Vec<u8>,
}

/// A CA named `ca_name` and a certificate for `names` (the first is also its
/// common name) signed by it.
pub fn test_certs(ca_name: &str, names: &[&str]) -> TestCerts {
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, ca_name);
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().unwrap()).unwrap();

    let key = KeyPair::generate().unwrap();
    let mut params =
        CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>()).unwrap();
    params.distinguished_name.push(DnType::CommonName, names[0]);
    let server = params.signed_by(&key, &ca).unwrap();
    TestCerts {
        ca_pem: ca.pem(),
        server_pem: server.pem(),
        server_der: server.der().to_vec(),
        key_pem: key.serialize_pem(),
        key_der: key.serialize_der(),
    }
}
