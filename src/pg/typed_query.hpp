#pragma once
// Running the statements of queries.sql through their generated descriptors
// (pg/queries.hpp): parameters are given by name, in an `args` aggregate of
// the query, and result columns are read by the query's own column enum.
//
//   const auto r = exec_prepared(tx, q::reschedule::args{.id = ..., .attempt = ..., ...});
//   for (const auto& row : r) row[q::reschedule::col::id].as<std::int64_t>();
//
// A parameter left out, added or renamed in queries.sql, or a column read
// that the query no longer returns (or that belongs to another query), fails
// the build instead of a statement at run time.

#include <cstddef>
#include <string>
#include <tuple>
#include <type_traits>

#include <pqxx/result>
#include <pqxx/row>
#include <pqxx/transaction_base>

#include "pg/named_queries.hpp"
#include "pg/queries.hpp"

namespace outboxd::pg {

// One row of query Q's result.
template <typename Q>
class row_of {
public:
    explicit row_of(pqxx::row r) : row_(std::move(r)) {}
    [[nodiscard]] pqxx::field operator[](typename Q::col c) const {
        return row_[static_cast<pqxx::row::size_type>(c)];
    }

private:
    pqxx::row row_;
};

// Query Q's result; checks at construction that it has Q's columns.
template <typename Q>
class rows_of {
public:
    explicit rows_of(pqxx::result r) : result_(std::move(r)) {}

    [[nodiscard]] std::size_t size() const noexcept { return static_cast<std::size_t>(result_.size()); }
    [[nodiscard]] bool empty() const noexcept { return result_.empty(); }
    [[nodiscard]] std::size_t affected_rows() const noexcept { return result_.affected_rows(); }
    [[nodiscard]] row_of<Q> operator[](std::size_t i) const {
        return row_of<Q>(result_[static_cast<pqxx::result::size_type>(i)]);
    }
    // Exactly one row, or pqxx::unexpected_rows.
    [[nodiscard]] row_of<Q> one() const {
        if (result_.size() != 1) {
            throw pqxx::unexpected_rows(std::string(Q::name) + " returned " + std::to_string(result_.size()) +
                                        " rows, expected 1");
        }
        return (*this)[0];
    }

    class iterator {
    public:
        iterator(const pqxx::result& r, pqxx::result::size_type i) : result_(&r), i_(i) {}
        row_of<Q> operator*() const { return row_of<Q>((*result_)[i_]); }
        iterator& operator++() {
            ++i_;
            return *this;
        }
        bool operator==(const iterator& o) const { return i_ == o.i_; }

    private:
        const pqxx::result* result_;
        pqxx::result::size_type i_;
    };
    [[nodiscard]] iterator begin() const { return iterator(result_, 0); }
    [[nodiscard]] iterator end() const { return iterator(result_, result_.size()); }

private:
    pqxx::result result_;
};

template <typename Args>
using query_of = typename Args::query_type;

// Runs the statement prepared as `prepared_name` (one of Q's sizes, say)
// with Args's values as $1..$n.
template <typename Args>
rows_of<query_of<Args>> exec_prepared(pqxx::transaction_base& tx, const std::string& prepared_name,
                                      const Args& args) {
    static_assert(std::tuple_size_v<decltype(args.values())> == query_of<Args>::params.size());
    return rows_of<query_of<Args>>(std::apply(
        [&](const auto&... v) { return tx.exec_prepared(prepared_name, v...); }, args.values()));
}

// Runs the statement prepared under its own name.
template <typename Args>
rows_of<query_of<Args>> exec_prepared(pqxx::transaction_base& tx, const Args& args) {
    return exec_prepared(tx, std::string(query_of<Args>::name), args);
}

// Runs `sql`, the text of Args's query (with its placeholders filled in),
// with Args's values as $1..$n, unprepared.
template <typename Args>
rows_of<query_of<Args>> exec_params(pqxx::transaction_base& tx, const std::string& sql, const Args& args) {
    static_assert(std::tuple_size_v<decltype(args.values())> == query_of<Args>::params.size());
    return rows_of<query_of<Args>>(
        std::apply([&](const auto&... v) { return tx.exec_params(sql, v...); }, args.values()));
}

// Runs Args's query from `book`, unprepared.
template <typename Args>
rows_of<query_of<Args>> exec_params(pqxx::transaction_base& tx, const query_book& book, const Args& args) {
    return exec_params(tx, book.sql<query_of<Args>>(), args);
}

// Runs query Q, which takes no parameters, from `book`, unprepared.
template <typename Q>
rows_of<Q> exec(pqxx::transaction_base& tx, const query_book& book) {
    static_assert(Q::params.empty(), "this query takes parameters: pass its args");
    return rows_of<Q>(tx.exec(book.sql<Q>()));
}

}  // namespace outboxd::pg
