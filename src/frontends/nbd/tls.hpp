// GnuTLS for the NBD server: server credentials (X.509 certificates from a
// directory, a PSK file in psktool's format, or both; optionally the CA that
// client certificates must be signed by) and sessions that do no I/O
// themselves. A session reads ciphertext from and writes ciphertext
// to memory buffers the connection owns (tls_pipe), so the io_uring loop
// moves the bytes and TLS stays off the socket.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <gnutls/gnutls.h>

#include <softblk/types.hpp>

namespace softblk::nbd {

// Ciphertext buffers of one connection: `in` holds received bytes from
// in_start to in_end; `out` collects bytes to send.
struct tls_pipe {
    std::vector<uint8_t> in;
    size_t in_start = 0;
    size_t in_end = 0;
    std::vector<uint8_t> out;
};

class tls_credentials {
public:
    ~tls_credentials();

    // Loads `certs_dir`/server-cert.pem and server-key.pem (the layout
    // qemu-nbd and nbdkit use) when certs_dir is not empty, and the PSK
    // file (lines "identity:hexkey", as psktool writes) when psk_file is
    // not empty. At least one must be given. With verify_peer, sessions
    // require a client certificate signed by `certs_dir`/ca-cert.pem (and
    // not revoked by `certs_dir`/ca-crl.pem when that file exists);
    // verify_peer needs certs_dir. Clients that authenticate with a PSK are
    // not asked for a certificate. Control thread.
    static result<std::shared_ptr<tls_credentials>> load(const std::string& certs_dir,
                                                         const std::string& psk_file,
                                                         bool verify_peer);

    // A server session over `pipe`, which must outlive it. Any thread.
    // Returns nullptr when GnuTLS fails to allocate it.
    gnutls_session_t new_session(tls_pipe& pipe) const;

    // After gnutls_handshake succeeded on `session`: empty when the client
    // is accepted, else why not (its certificate failed verification). With
    // verify_peer off, or for a PSK session, always empty. Any thread.
    std::string check_peer(gnutls_session_t session) const;

    // Why gnutls_handshake failed with `rc` on `session`, for the log (the
    // certificate verification status when that is what failed). Any thread.
    static std::string describe_failure(gnutls_session_t session, int rc);

private:
    tls_credentials() = default;
    bool _verify_peer = false;
    gnutls_certificate_credentials_t _x509 = nullptr;
    gnutls_psk_server_credentials_t _psk = nullptr;
    gnutls_priority_t _priority = nullptr;
};

}  // namespace softblk::nbd
