#pragma once
// Standalone Asio for the cluster layer's sources (transport, Redis
// coordinator), included before anything else in each of them; with
// TROUPE_ASIO_SSL defined, Asio's TLS stream too (the transport only). GCC's sanitizer builds warn inside Asio's headers:
// -Wtsan on the fences its handlers use (ThreadSanitizer does not model
// fences; the io_context's own mutex is what orders work handed between
// threads here) and -Wnull-dereference through inlining. The exemption
// covers only the headers included here, and a warning is placed where the
// header that holds it (<atomic>) was first read, hence "first".

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wnull-dereference"
#pragma GCC diagnostic ignored "-Wtsan"
#endif
#include <atomic>
#include <memory>
#include <asio.hpp>
#ifdef TROUPE_ASIO_SSL
#include <asio/ssl.hpp>  // the transport's TLS (OpenSSL); its files define TROUPE_ASIO_SSL first
#endif
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
