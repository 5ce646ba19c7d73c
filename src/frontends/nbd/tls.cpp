#include "tls.hpp"

#include <cerrno>
#include <cstring>
#include <sys/stat.h>

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
                                                              const std::string& psk_file)
{
    if (certs_dir.empty() && psk_file.empty()) {
        return make_error(EINVAL, "tls: give tls-certs=DIR (server-cert.pem, server-key.pem) and/or "
                                  "tls-psk=FILE (from psktool)");
    }
    std::shared_ptr<tls_credentials> c(new tls_credentials());
    if (!certs_dir.empty()) {
        const std::string cert = certs_dir + "/server-cert.pem";
        const std::string key = certs_dir + "/server-key.pem";
        if (!readable(cert) || !readable(key)) {
            return make_error(ENOENT, fmt::format("tls-certs={}: needs server-cert.pem and server-key.pem "
                                                  "in that directory",
                                                  certs_dir));
        }
        if (gnutls_certificate_allocate_credentials(&c->_x509) != GNUTLS_E_SUCCESS) {
            return make_error(ENOMEM, "tls: cannot allocate certificate credentials");
        }
        const int rc = gnutls_certificate_set_x509_key_file(c->_x509, cert.c_str(), key.c_str(),
                                                            GNUTLS_X509_FMT_PEM);
        if (rc < 0) {
            return make_error(EINVAL, fmt::format("tls-certs={}: cannot load the key pair: {}", certs_dir,
                                                  gnutls_strerror(rc)));
        }
        gnutls_certificate_set_known_dh_params(c->_x509, GNUTLS_SEC_PARAM_MEDIUM);
    }
    if (!psk_file.empty()) {
        if (!readable(psk_file)) {
            return make_error(ENOENT, fmt::format("tls-psk={}: no such file (make one with psktool -p FILE "
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
        return make_error(EINVAL, fmt::format("tls: priority {}: {}", priority, gnutls_strerror(rc)));
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
    if (_psk != nullptr) {
        gnutls_credentials_set(s, GNUTLS_CRD_PSK, _psk);
    }
    gnutls_transport_set_ptr(s, &pipe);
    gnutls_transport_set_pull_function(s, pipe_pull);
    gnutls_transport_set_push_function(s, pipe_push);
    return s;
}

}  // namespace softblk::nbd
