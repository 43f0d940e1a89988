// cpp-httplib as Debian builds it: the shared library is compiled with OpenSSL, zlib and brotli
// support, and every includer must define the same macros or class layouts disagree (crash).
#pragma once

#define CPPHTTPLIB_OPENSSL_SUPPORT
#define CPPHTTPLIB_ZLIB_SUPPORT
#define CPPHTTPLIB_BROTLI_SUPPORT
#include <httplib.h>
