#include "tls.hpp"

#include <cerrno>
#include <cstring>
#include <sys/stat.h>

#include <gnutls/x509.h>

#include <fmt/core.h>

namespace softblk::nbd {

namespace {

ssize_t pipe_pull(gnutls_transport_ptr_t ptr, void* data, size_t size)
{
    auto* p = static_cast<tls_pipe*>(ptr);
    const size_t avail = p->in_end - p->in_start;
    if (avail == 0) {
        errno = EAGAIN;
        return -1;
    }
    const size_t n = std::min(avail, size);
    std::memcpy(data, p->in.data() + p->in_start, n);
    p->in_start += n;
    if (p->in_start == p->in_end) {
        p->in_start = p->in_end = 0;
    }
    return static_cast<ssize_t>(n);
}

ssize_t pipe_push(gnutls_transport_ptr_t ptr, const void* data, size_t size)
{
    auto* p = static_cast<tls_pipe*>(ptr);
    const auto* b = static_cast<const uint8_t*>(data);
    p->out.insert(p->out.end(), b, b + size);
    return static_cast<ssize_t>(size);
}

bool readable(const std::string& path)
{
    struct stat st;
    return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

// Client certificates must be for TLS clients when they say what they are
// for (a certificate without the extended key usage extension passes).
// Static: sessions may keep a pointer to it (gnutls_session_set_verify_cert2).
gnutls_typed_vdata_st g_client_purpose{
    .type = GNUTLS_DT_KEY_PURPOSE_OID,
    .data = reinterpret_cast<unsigned char*>(const_cast<char*>(GNUTLS_KP_TLS_WWW_CLIENT)),
    .size = 0,
};

std::string status_text(unsigned status)
{
    gnutls_datum_t out{};
    if (gnutls_certificate_verification_status_print(status, GNUTLS_CRT_X509, &out, 0) < 0) {
        return fmt::format("verification status {:#x}", status);
    }
    std::string text(reinterpret_cast<const char*>(out.data), out.size);
    gnutls_free(out.data);
    while (!text.empty() && (text.back() == ' ' || text.back() == '\0')) {
        text.pop_back();
    }
    return text;
}

// The subject of the client's certificate, or "" when it sent none.
std::string peer_subject(gnutls_session_t session)
{
    unsigned count = 0;
    const gnutls_datum_t* certs = gnutls_certificate_get_peers(session, &count);
    if (certs == nullptr || count == 0) {
        return {};
    }
    gnutls_x509_crt_t crt = nullptr;
    if (gnutls_x509_crt_init(&crt) != GNUTLS_E_SUCCESS) {
        return {};
    }
    std::string subject;
    gnutls_datum_t dn{};
    if (gnutls_x509_crt_import(crt, &certs[0], GNUTLS_X509_FMT_DER) == GNUTLS_E_SUCCESS &&
        gnutls_x509_crt_get_dn3(crt, &dn, 0) == GNUTLS_E_SUCCESS) {
        subject.assign(reinterpret_cast<const char*>(dn.data), dn.size);
        gnutls_free(dn.data);
    }
    gnutls_x509_crt_deinit(crt);
    return subject;
}

}  // namespace

tls_credentials::~tls_credentials()
{
    if (_priority != nullptr) {
        gnutls_priority_deinit(_priority);
    }
    if (_x509 != nullptr) {
        gnutls_certificate_free_credentials(_x509);
    }
    if (_psk != nullptr) {
        gnutls_psk_free_server_credentials(_psk);
    }
}

result<std::shared_ptr<tls_credentials>> tls_credentials::load(const std::string& certs_dir,
                                                               const std::string& psk_file,
                                                               bool verify_peer)
{
    if (certs_dir.empty() && psk_file.empty()) {
        return make_error(EINVAL,
                          "tls: give tls-certs=DIR (server-cert.pem, server-key.pem) and/or "
                          "tls-psk=FILE (from psktool)");
    }
    if (verify_peer && certs_dir.empty()) {
        return make_error(
            EINVAL,
            "tls-verify-peer=1 needs tls-certs=DIR with ca-cert.pem, the CA that signs "
            "client certificates");
    }
    std::shared_ptr<tls_credentials> c(new tls_credentials());
    if (!certs_dir.empty()) {
        const std::string cert = certs_dir + "/server-cert.pem";
        const std::string key = certs_dir + "/server-key.pem";
        if (!readable(cert) || !readable(key)) {
            return make_error(ENOENT,
                              fmt::format("tls-certs={}: needs server-cert.pem and server-key.pem "
                                          "in that directory",
                                          certs_dir));
        }
        if (gnutls_certificate_allocate_credentials(&c->_x509) != GNUTLS_E_SUCCESS) {
            return make_error(ENOMEM, "tls: cannot allocate certificate credentials");
        }
        const int rc = gnutls_certificate_set_x509_key_file(c->_x509, cert.c_str(), key.c_str(),
                                                            GNUTLS_X509_FMT_PEM);
        if (rc < 0) {
            return make_error(EINVAL, fmt::format("tls-certs={}: cannot load the key pair: {}",
                                                  certs_dir, gnutls_strerror(rc)));
        }
        gnutls_certificate_set_known_dh_params(c->_x509, GNUTLS_SEC_PARAM_MEDIUM);
    }
    if (verify_peer) {
        const std::string ca = certs_dir + "/ca-cert.pem";
        if (!readable(ca)) {
            return make_error(
                ENOENT,
                fmt::format("tls-verify-peer=1: {} is missing (the PEM certificate of the CA "
                            "that client certificates must be signed by)",
                            ca));
        }
        const int n =
            gnutls_certificate_set_x509_trust_file(c->_x509, ca.c_str(), GNUTLS_X509_FMT_PEM);
        if (n < 0) {
            return make_error(EINVAL, fmt::format("tls-verify-peer=1: cannot load {}: {}", ca,
                                                  gnutls_strerror(n)));
        }
        if (n == 0) {
            return make_error(EINVAL,
                              fmt::format("tls-verify-peer=1: {} holds no certificate", ca));
        }
        const std::string crl = certs_dir + "/ca-crl.pem";
        if (readable(crl)) {
            const int rc =
                gnutls_certificate_set_x509_crl_file(c->_x509, crl.c_str(), GNUTLS_X509_FMT_PEM);
            if (rc < 0) {
                return make_error(EINVAL, fmt::format("tls-verify-peer=1: cannot load {}: {}", crl,
                                                      gnutls_strerror(rc)));
            }
        }
        c->_verify_peer = true;
    }
    if (!psk_file.empty()) {
        if (!readable(psk_file)) {
            return make_error(ENOENT,
                              fmt::format("tls-psk={}: no such file (make one with psktool -p FILE "
                                          "-u IDENTITY)",
                                          psk_file));
        }
        if (gnutls_psk_allocate_server_credentials(&c->_psk) != GNUTLS_E_SUCCESS) {
            return make_error(ENOMEM, "tls: cannot allocate PSK credentials");
        }
        const int rc = gnutls_psk_set_server_credentials_file(c->_psk, psk_file.c_str());
        if (rc < 0) {
            return make_error(EINVAL, fmt::format("tls-psk={}: {}", psk_file, gnutls_strerror(rc)));
        }
        gnutls_psk_set_server_known_dh_params(c->_psk, GNUTLS_SEC_PARAM_MEDIUM);
    }
    const char* priority = c->_psk != nullptr ? "NORMAL:+ECDHE-PSK:+DHE-PSK:+PSK" : "NORMAL";
    const int rc = gnutls_priority_init(&c->_priority, priority, nullptr);
    if (rc < 0) {
        return make_error(EINVAL,
                          fmt::format("tls: priority {}: {}", priority, gnutls_strerror(rc)));
    }
    return c;
}

gnutls_session_t tls_credentials::new_session(tls_pipe& pipe) const
{
    gnutls_session_t s = nullptr;
    if (gnutls_init(&s, GNUTLS_SERVER | GNUTLS_NONBLOCK) != GNUTLS_E_SUCCESS) {
        return nullptr;
    }
    gnutls_priority_set(s, _priority);
    if (_x509 != nullptr) {
        gnutls_credentials_set(s, GNUTLS_CRD_CERTIFICATE, _x509);
    }
    if (_verify_peer) {
        // Ask for a certificate (a session that uses a PSK is not asked)
        // and verify it during the handshake, which then fails with an
        // alert to the client. check_peer verifies again afterwards.
        gnutls_certificate_server_set_request(s, GNUTLS_CERT_REQUIRE);
        gnutls_session_set_verify_cert2(s, &g_client_purpose, 1, 0);
    }
    if (_psk != nullptr) {
        gnutls_credentials_set(s, GNUTLS_CRD_PSK, _psk);
    }
    gnutls_transport_set_ptr(s, &pipe);
    gnutls_transport_set_pull_function(s, pipe_pull);
    gnutls_transport_set_push_function(s, pipe_push);
    return s;
}

std::string tls_credentials::check_peer(gnutls_session_t session) const
{
    if (!_verify_peer || gnutls_auth_get_type(session) != GNUTLS_CRD_CERTIFICATE) {
        return {};
    }
    unsigned count = 0;
    if (gnutls_certificate_get_peers(session, &count) == nullptr || count == 0) {
        return "it sent no client certificate (tls-verify-peer=1)";
    }
    unsigned status = 0;
    const int rc = gnutls_certificate_verify_peers(session, &g_client_purpose, 1, &status);
    if (rc < 0) {
        return fmt::format("its certificate {} cannot be verified: {}", peer_subject(session),
                           gnutls_strerror(rc));
    }
    if (status != 0) {
        return fmt::format("its certificate {} is refused: {}", peer_subject(session),
                           status_text(status));
    }
    return {};
}

std::string tls_credentials::describe_failure(gnutls_session_t session, int rc)
{
    if (rc == GNUTLS_E_CERTIFICATE_VERIFICATION_ERROR) {
        return fmt::format("its certificate {} is refused: {}", peer_subject(session),
                           status_text(gnutls_session_get_verify_cert_status(session)));
    }
    if (rc == GNUTLS_E_NO_CERTIFICATE_FOUND || rc == GNUTLS_E_CERTIFICATE_REQUIRED) {
        return fmt::format(
            "it sent no client certificate (tls-verify-peer=1; a GnuTLS client sends none when "
            "it has none signed by the server's CA): {}",
            gnutls_strerror(rc));
    }
    return gnutls_strerror(rc);
}

}  // namespace softblk::nbd
