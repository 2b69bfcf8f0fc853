#include "pg/store.hpp"

#include <stdexcept>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <pqxx/pqxx>

#include "core/sql_ident.hpp"
#include "core/text.hpp"
#include "pg/migrator.hpp"
#include "pg/params.hpp"

namespace outboxd::pg {
namespace {

// Stored error texts are bounded: a huge error page must not bloat the row.
constexpr std::size_t max_error_bytes = 2048;

header_list parse_headers(const char* json_text) {
    header_list out;
    const auto object = nlohmann::json::parse(json_text);  // the column CHECK guarantees an object of strings
    out.reserve(object.size());
    for (const auto& [name, value] : object.items()) out.emplace_back(name, value.get<std::string>());
    return out;
}

template <typename T>
std::string array_literal(std::span<const lease_ref> refs, T lease_ref::*member) {
    std::string out = "{";
    for (std::size_t i = 0; i < refs.size(); ++i) {
        if (i) out.push_back(',');
        out += fmt::format("{}", refs[i].*member);
    }
    out.push_back('}');
    return out;
}

}  // namespace

store::store(std::string dsn, std::string schema, std::string lease_owner, bool relay_session)
    : dsn_(std::move(dsn)),
      schema_(std::move(schema)),
      owner_(std::move(lease_owner)),
      relay_session_(relay_session),
      queries_(schema_) {}

store::~store() = default;

void store::connect() {
    conn_.reset();
    auto c = std::make_unique<pqxx::connection>(dsn_);
    if (relay_session_) {
        pqxx::nontransaction tx(*c);
        tx.exec("SET synchronous_commit = off");  // see the constructor's comment
    }
    queries_.prepare(*c, {"claim", "complete", "reschedule", "bury", "release", "enqueue"});
    conn_ = std::move(c);
}

bool store::connected() const noexcept { return conn_ && conn_->is_open(); }

void store::disconnect() noexcept { conn_.reset(); }

pqxx::connection& store::conn() {
    if (!connected()) connect();
    return *conn_;
}

// Runs one statement; a lost connection is dropped so the next call starts
// afresh (libpqxx 6 would otherwise try to reactivate it behind our back).
template <typename F>
auto store::guarded(F&& f) {
    try {
        return f(conn());
    } catch (const pqxx::broken_connection&) {
        conn_.reset();
        throw;
    }
}

std::optional<int> store::schema_version() {
    return guarded([&](pqxx::connection& c) { return read_schema_version(c, schema_); });
}

claim_result store::claim(std::size_t limit, std::chrono::milliseconds lease) {
    return guarded([&](pqxx::connection& c) {
        pqxx::nontransaction tx(c);
        const auto r = tx.exec_prepared("claim", static_cast<long long>(limit), owner_,
                                        static_cast<long long>(lease.count()));
        claim_result out;
        out.events.reserve(r.size());
        for (const auto& row : r) {
            if (row[0].is_null()) {  // the next-due row (always last)
                if (!row[6].is_null()) {
                    out.next_due = std::chrono::milliseconds(std::max<long long>(0, row[6].as<long long>()));
                }
                continue;
            }
            event e;
            e.id = row[0].as<std::int64_t>();
            e.topic = row[1].c_str();
            if (!row[2].is_null()) e.ordering_key = std::string(row[2].c_str(), row[2].size());
            e.payload.assign(row[3].c_str(), row[3].size());
            e.headers = parse_headers(row[4].c_str());
            e.attempt = row[5].as<std::int32_t>();
            out.events.push_back(std::move(e));
        }
        return out;
    });
}

std::vector<std::int64_t> store::complete(std::span<const lease_ref> delivered) {
    if (delivered.empty()) return {};
    return guarded([&](pqxx::connection& c) {
        pqxx::nontransaction tx(c);
        const auto r = tx.exec_prepared("complete", array_literal(delivered, &lease_ref::id),
                                        array_literal(delivered, &lease_ref::attempt), owner_);
        std::vector<std::int64_t> ids;
        ids.reserve(r.size());
        for (const auto& row : r) ids.push_back(row[0].as<std::int64_t>());
        return ids;
    });
}

bool store::reschedule(lease_ref e, std::chrono::milliseconds delay, std::string_view error) {
    return guarded([&](pqxx::connection& c) {
        pqxx::nontransaction tx(c);
        const auto r = tx.exec_prepared("reschedule", e.id, e.attempt, owner_,
                                        static_cast<long long>(delay.count()),
                                        sanitize_text(error, max_error_bytes));
        return r.size() == 1;
    });
}

bool store::bury(lease_ref e, std::string_view error, std::optional<int> status, std::string_view response_excerpt) {
    return guarded([&](pqxx::connection& c) {
        pqxx::nontransaction tx(c);
        const std::optional<std::string> status_text =
            status ? std::optional<std::string>(fmt::format("{}", *status)) : std::nullopt;
        const auto r = tx.exec_prepared("bury", e.id, e.attempt, owner_, sanitize_text(error, max_error_bytes),
                                        nullable(status_text), sanitize_text(response_excerpt, max_error_bytes));
        return r.size() == 1;
    });
}

std::size_t store::release() {
    return guarded([&](pqxx::connection& c) {
        pqxx::nontransaction tx(c);
        return static_cast<std::size_t>(tx.exec_prepared("release", owner_).size());
    });
}

std::int64_t store::enqueue(const new_event& e) {
    return guarded([&](pqxx::connection& c) {
        pqxx::work tx(c);
        const auto r = tx.exec_prepared1("enqueue", e.topic, e.payload, nullable(e.ordering_key),
                                         nullable(e.idempotency_key), e.headers,
                                         static_cast<long long>(e.delay.count()));
        tx.commit();
        return r[0].as<std::int64_t>();
    });
}

}  // namespace outboxd::pg
