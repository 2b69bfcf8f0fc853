// The one translation unit that compiles Boost.Asio and Boost.Beast.
//
// The project defines BOOST_ASIO_SEPARATE_COMPILATION and
// BOOST_BEAST_SEPARATE_COMPILATION for every file (see meson.build), so the
// headers elsewhere only declare the non-template parts; their definitions
// are built here, once, instead of in every file that includes Asio/Beast.
// The OpenSSL part is compiled too, so HTTPS needs no build change.

#include <utility>  // before Asio: Boost 1.74's awaitable.hpp misses it

// GCC 12 with -fsanitize=address reports a false -Wmaybe-uninitialized
// inside Beast's parser (boost::optional in basic_parser::do_field) despite
// the system-header include; it would break sanitizer builds under -Werror.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <boost/asio/impl/src.hpp>
#include <boost/asio/ssl/impl/src.hpp>
#include <boost/beast/src.hpp>
#pragma GCC diagnostic pop
