// GnuTLS for the NBD server: server credentials (X.509 certificates from a
// directory, a PSK file in psktool's format, or both) and sessions that do
// no I/O themselves. A session reads ciphertext from and writes ciphertext
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
    // not empty. At least one must be given. Control thread.
    static result<std::shared_ptr<tls_credentials>> load(const std::string& certs_dir,
                                                         const std::string& psk_file);

    // A server session over `pipe`, which must outlive it. Any thread.
    // Returns nullptr when GnuTLS fails to allocate it.
    gnutls_session_t new_session(tls_pipe& pipe) const;

private:
    tls_credentials() = default;
    gnutls_certificate_credentials_t _x509 = nullptr;
    gnutls_psk_server_credentials_t _psk = nullptr;
    gnutls_priority_t _priority = nullptr;
};

}  // namespace softblk::nbd
