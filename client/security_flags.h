// The client security flags shared by maskctl and maskload (one wording, one set of names).
#pragma once

#include <CLI/CLI.hpp>

#include "client/client.h"

namespace maskd::client {

// Only the token has an environment variable ($MASKD_TOKEN, read by ApplySecurityFlags): MASKD_TLS_CERT
// and MASKD_TLS_KEY are maskd's own settings, and a client picking them up from the same shell would
// present the server's certificate as its own.
inline void AddSecurityFlags(CLI::App& app, SecurityFlags& f) {
  const char* g = "Security";
  app.add_flag("--tls", f.tls, "connect with TLS, verifying the server against the system's CA roots")
      ->group(g);
  app.add_option("--tls-ca", f.tls_ca, "PEM CA certificate(s) to verify maskd's certificate (implies --tls)")
      ->type_name("PATH")
      ->group(g);
  app.add_option("--tls-cert", f.tls_cert, "PEM client certificate chain for mutual TLS (with --tls-key)")
      ->type_name("PATH")
      ->group(g);
  app.add_option("--tls-key", f.tls_key, "PEM private key of --tls-cert")
      ->type_name("PATH")
      ->group(g);
  app.add_option("--tls-server-name", f.tls_server_name,
                 "name maskd's certificate must carry when it differs from the --server host")
      ->type_name("NAME")
      ->group(g);
  app.add_option("--token", f.token,
                 "bearer token sent as 'authorization: Bearer TOKEN' (TLS only; default $MASKD_TOKEN; "
                 "prefer --token-file: a command line is visible to other local users)")
      ->type_name("TOKEN")
      ->group(g);
  app.add_option("--token-file", f.token_file, "file whose first non-empty line is the bearer token")
      ->type_name("PATH")
      ->group(g);
}

}  // namespace maskd::client
