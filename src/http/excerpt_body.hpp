#pragma once
// The bounded response body: a Beast body type that keeps only the first
// `keep` bytes of a response body and counts the rest, so a large response
// costs no memory beyond the excerpt while the connection stays usable (the
// body is still read to its end). More than `limit` bytes in total fail
// with http::error::body_limit once the excerpt is kept; the parser's own
// body_limit would instead reject a large Content-Length before keeping any
// excerpt (see response_limits.hpp).

#include <utility>  // before Asio: Boost 1.74's awaitable.hpp misses it

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>

#include <boost/beast/core/buffers_range.hpp>
#include <boost/beast/core/error.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/message.hpp>
#include <boost/optional/optional.hpp>

namespace outboxd::http {

struct excerpt_body {
    struct value_type {
        std::string text;
        std::size_t keep = 0;
        std::uint64_t limit = 0;
        std::uint64_t received = 0;
    };

    class reader {
    public:
        template <bool is_request, class fields_type>
        reader(boost::beast::http::header<is_request, fields_type>& /*header*/, value_type& body) : body_(body) {}

        void init(const boost::optional<std::uint64_t>& /*content_length*/, boost::beast::error_code& ec) {
            ec = {};
        }

        template <class const_buffer_sequence>
        std::size_t put(const const_buffer_sequence& buffers, boost::beast::error_code& ec) {
            ec = {};
            std::size_t total = 0;
            for (auto const b : boost::beast::buffers_range_ref(buffers)) {
                total += b.size();
                std::size_t const room = body_.keep - std::min(body_.keep, body_.text.size());
                if (room > 0) body_.text.append(static_cast<const char*>(b.data()), std::min(room, b.size()));
            }
            body_.received += total;
            if (body_.received > body_.limit) ec = boost::beast::http::error::body_limit;
            return total;
        }

        void finish(boost::beast::error_code& ec) { ec = {}; }

    private:
        value_type& body_;
    };
};

}  // namespace outboxd::http
