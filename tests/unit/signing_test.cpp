#include <doctest/doctest.h>

#include <stdexcept>

#include "core/signing.hpp"

using namespace outboxd;

TEST_CASE("signing: the Standard Webhooks specification's test vector") {
    const auto secrets = parse_signing_secrets("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw");
    CHECK(sign_webhook(secrets, "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, R"({"test": 2432232314})") ==
          "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=");
}

TEST_CASE("signing: several secrets give space-separated signatures, in order") {
    const auto one = parse_signing_secrets("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw");
    const auto two = parse_signing_secrets(
        "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw   whsec_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA");
    REQUIRE(two.size() == 2);
    const auto both = sign_webhook(two, "42", 1, "{}");
    const auto first = sign_webhook(one, "42", 1, "{}");
    CHECK(both.starts_with(first + " v1,"));
    CHECK(both.size() == 2 * first.size() + 1);
}

TEST_CASE("signing: any change to id, timestamp or body changes the signature") {
    const auto s = parse_signing_secrets("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw");
    const auto base = sign_webhook(s, "1", 100, "{}");
    CHECK(sign_webhook(s, "2", 100, "{}") != base);
    CHECK(sign_webhook(s, "1", 101, "{}") != base);
    CHECK(sign_webhook(s, "1", 100, "{ }") != base);
}

TEST_CASE("signing: bad secrets are refused without echoing them") {
    for (const auto* bad : {"MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",  // no prefix
                            "whsec_",                            // empty
                            "whsec_not*base64!!",                // alphabet
                            "whsec_c2hvcnQ=",                    // 5 bytes: too short
                            "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaS"}) {  // bad length
        CAPTURE(bad);
        try {
            (void)signing_secret::parse(bad);
            FAIL("accepted");
        } catch (const std::invalid_argument& e) {
            const std::string message = e.what();
            CHECK(message.find("MfKQ9r8") == std::string::npos);
            CHECK(message.find("c2hvcnQ") == std::string::npos);
        }
    }
}

TEST_CASE("base64: round trips and strictness") {
    for (const std::string s : {"", "f", "fo", "foo", "foob", "fooba", "foobar"}) {
        if (s.empty()) continue;
        CHECK(base64_decode(base64_encode(s)) == s);
    }
    CHECK(base64_encode("foobar") == "Zm9vYmFy");
    CHECK(base64_encode("fo") == "Zm8=");
    CHECK_THROWS_AS((void)base64_decode("Zm8"), std::invalid_argument);
    CHECK_THROWS_AS((void)base64_decode("Z=m8"), std::invalid_argument);
    CHECK_THROWS_AS((void)base64_decode("Zm 8"), std::invalid_argument);
}
