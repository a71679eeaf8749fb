/*
 * test_pki.c — security/'s certificates: the CA and what it signs, and the
 * CSR signing path that takes untrusted bytes at Join: garbage, a wrong key
 * type, a bad signature, and requests for CA:TRUE or extra SANs are refused;
 * what is signed carries only what the coordinator decides.
 */
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>
#include <openssl/pem.h>
#include <openssl/x509v3.h>

#include "security/security.h"
#include "util/util.h"

static char *ca, *ca_key;

static void setup(void) {
    char err[ERR_LEN];
    SecurityCertSpec spec = {"Test CA", NULL, 1, 0, 0, 86400};
    cr_assert_eq(security_cert_create(&spec, NULL, NULL, &ca, &ca_key, err), 0, "%s", err);
}
static void teardown(void) {
    free(ca), free(ca_key);
}
TestSuite(pki, .init = setup, .fini = teardown);

/* A CSR made with OpenSSL directly, so a test can ask for anything. */
static char *custom_csr(EVP_PKEY *key, const char *ext_nid_value, int ext_nid, int tamper) {
    X509_REQ *req = X509_REQ_new();
    X509_NAME_add_entry_by_txt(X509_REQ_get_subject_name(req), "CN", MBSTRING_UTF8,
                               (const unsigned char *)"alpha", -1, -1, 0);
    X509_REQ_set_pubkey(req, key);
    if (ext_nid_value) {
        STACK_OF(X509_EXTENSION) *exts = sk_X509_EXTENSION_new_null();
        sk_X509_EXTENSION_push(exts, X509V3_EXT_conf_nid(NULL, NULL, ext_nid, ext_nid_value));
        X509_REQ_add_extensions(req, exts);
        sk_X509_EXTENSION_pop_free(exts, X509_EXTENSION_free);
    }
    X509_REQ_sign(req, key, EVP_sha256());
    if (tamper) { /* change the subject after signing */
        X509_NAME_add_entry_by_txt(X509_REQ_get_subject_name(req), "O", MBSTRING_UTF8,
                                   (const unsigned char *)"evil", -1, -1, 0);
    }
    BIO *b = BIO_new(BIO_s_mem());
    PEM_write_bio_X509_REQ(b, req);
    char *data;
    long n = BIO_get_mem_data(b, &data);
    char *s = strndup(data, (size_t)n);
    BIO_free(b);
    X509_REQ_free(req);
    return s;
}

static void expect_refused(const char *csr, size_t len, const char *why) {
    char *cert = NULL, err[ERR_LEN];
    cr_assert_eq(security_csr_sign(ca, ca_key, (const uint8_t *)csr, len, "alpha", 30, &cert, err),
                 -1, "signed: %s", why);
    cr_assert_null(cert);
    cr_assert_not_null(strstr(err, why), "want '%s', got '%s'", why, err);
}

Test(pki, malformed_and_greedy_csrs_are_refused) {
    expect_refused("not a csr at all", 16, "not a PEM CSR");
    expect_refused("", 0, "expected a PEM CSR");
    EVP_PKEY *rsa = EVP_RSA_gen(2048), *ec = EVP_EC_gen("P-256"), *ec384 = EVP_EC_gen("P-384");
    char *c = custom_csr(rsa, NULL, 0, 0);
    expect_refused(c, strlen(c), "must be EC P-256");
    free(c);
    c = custom_csr(ec384, NULL, 0, 0);
    expect_refused(c, strlen(c), "must be EC P-256");
    free(c);
    c = custom_csr(ec, "critical,CA:TRUE", NID_basic_constraints, 0);
    expect_refused(c, strlen(c), "asks for extensions");
    free(c);
    c = custom_csr(ec, "DNS:alpha,DNS:coordinator,IP:10.0.0.1", NID_subject_alt_name, 0);
    expect_refused(c, strlen(c), "asks for extensions");
    free(c);
    c = custom_csr(ec, NULL, 0, 1);
    expect_refused(c, strlen(c), "signature does not verify");
    free(c);
    EVP_PKEY_free(rsa), EVP_PKEY_free(ec), EVP_PKEY_free(ec384);
}

Test(pki, a_signed_csr_carries_only_what_the_coordinator_decides) {
    char *csr, *key, *cert, err[ERR_LEN];
    cr_assert_eq(security_csr_create("whatever-the-site-says", &csr, &key, err), 0, "%s", err);
    cr_assert_eq(
        security_csr_sign(ca, ca_key, (const uint8_t *)csr, strlen(csr), "alpha", 30, &cert, err),
        0, "%s", err);
    BIO *b = BIO_new_mem_buf(cert, -1);
    X509 *x = PEM_read_bio_X509(b, NULL, NULL, NULL);
    BIO_free(b);
    cr_assert_not_null(x);
    char cn[128];
    X509_NAME_get_text_by_NID(X509_get_subject_name(x), NID_commonName, cn, sizeof cn);
    cr_assert_str_eq(cn, "alpha");
    cr_assert_eq(X509_check_ca(x), 0, "a site certificate must not be a CA");
    cr_assert(X509_get_extended_key_usage(x) & XKU_SSL_CLIENT);
    cr_assert_not(X509_get_extended_key_usage(x) & XKU_SSL_SERVER);
    GENERAL_NAMES *sans = X509_get_ext_d2i(x, NID_subject_alt_name, NULL, NULL);
    cr_assert_eq(sk_GENERAL_NAME_num(sans), 1);
    GENERAL_NAME *g = sk_GENERAL_NAME_value(sans, 0);
    cr_assert_eq(g->type, GEN_DNS);
    cr_assert_str_eq((const char *)ASN1_STRING_get0_data(g->d.dNSName), "alpha");
    GENERAL_NAMES_free(sans);
    /* and it verifies against the CA, with a 128-bit serial */
    b = BIO_new_mem_buf(ca, -1);
    X509 *cax = PEM_read_bio_X509(b, NULL, NULL, NULL);
    BIO_free(b);
    cr_assert_eq(X509_verify(x, X509_get0_pubkey(cax)), 1);
    SecurityIdentity id;
    cr_assert_eq(security_cert_identity(cert, &id, err), 0);
    cr_assert_eq(strlen(id.serial_hex), 32, "serial %s", id.serial_hex);
    cr_assert_eq(strlen(id.sha256_hex), 64);
    X509_free(x), X509_free(cax);
    free(csr), free(key), free(cert);
}

Test(pki, tokens_are_256_random_bits) {
    char a[SECURITY_TOKEN_HEX], b[SECURITY_TOKEN_HEX], err[ERR_LEN];
    cr_assert_eq(security_random_token(a, err), 0);
    cr_assert_eq(security_random_token(b, err), 0);
    cr_assert_eq(strlen(a), 64);
    cr_assert_str_neq(a, b);
    cr_assert(security_ct_equal(a, a, 64));
    cr_assert_not(security_ct_equal(a, b, 64));
}
