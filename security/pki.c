/*
 * pki.c — keys and certificates through OpenSSL 3's EVP and X509 APIs: EC
 * P-256 keys, a self-signed CA, certificates signed by it (server or client
 * use, with SANs), and the identity of a peer certificate (name, serial,
 * SHA-256 fingerprint of its DER form).
 *
 * Everything is PEM in malloc'd NUL-terminated strings; the caller frees.
 */
#include <stdlib.h>
#include <string.h>

#include <openssl/bio.h>
#include <openssl/crypto.h>
#include <openssl/ec.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include "security.h"
#include "util/util.h"

static char *bio_string(BIO *b) {
    char *data;
    long n = BIO_get_mem_data(b, &data);
    char *s = malloc((size_t)n + 1);
    if (s) {
        memcpy(s, data, (size_t)n);
        s[n] = '\0';
    }
    return s;
}

static char *key_pem(EVP_PKEY *k) {
    BIO *b = BIO_new(BIO_s_mem());
    char *s = NULL;
    if (b && PEM_write_bio_PrivateKey(b, k, NULL, NULL, 0, NULL, NULL)) s = bio_string(b);
    BIO_free(b);
    return s;
}

static char *cert_pem(X509 *c) {
    BIO *b = BIO_new(BIO_s_mem());
    char *s = NULL;
    if (b && PEM_write_bio_X509(b, c)) s = bio_string(b);
    BIO_free(b);
    return s;
}

static X509 *cert_parse(const char *pem) {
    BIO *b = BIO_new_mem_buf(pem, -1);
    X509 *c = b ? PEM_read_bio_X509(b, NULL, NULL, NULL) : NULL;
    BIO_free(b);
    return c;
}

static EVP_PKEY *key_parse(const char *pem) {
    BIO *b = BIO_new_mem_buf(pem, -1);
    EVP_PKEY *k = b ? PEM_read_bio_PrivateKey(b, NULL, NULL, NULL) : NULL;
    BIO_free(b);
    return k;
}

static int add_ext(X509 *cert, X509 *issuer, int nid, const char *value) {
    X509V3_CTX ctx;
    X509V3_set_ctx(&ctx, issuer, cert, NULL, NULL, 0);
    X509_EXTENSION *ext = X509V3_EXT_conf_nid(NULL, &ctx, nid, value);
    if (ext == NULL) return -1;
    int ok = X509_add_ext(cert, ext, -1);
    X509_EXTENSION_free(ext);
    return ok ? 0 : -1;
}

/* A 128-bit positive serial from the CSPRNG. */
static int random_serial(X509 *cert) {
    unsigned char bytes[16];
    if (RAND_bytes(bytes, sizeof bytes) != 1) return -1;
    bytes[0] &= 0x7f;
    bytes[0] |= 0x01; /* positive, never zero, always 16 bytes */
    BIGNUM *bn = BN_bin2bn(bytes, sizeof bytes, NULL);
    int ok = bn && BN_to_ASN1_INTEGER(bn, X509_get_serialNumber(cert)) != NULL;
    BN_free(bn);
    return ok ? 0 : -1;
}

/* The fields every certificate Strait issues has: version 3, a random
 * serial, validity from now + not_before_s to now + not_after_s, the
 * subject's key and CN, and the issuer's name (issuer NULL: self-issued).
 * -1 with err set when OpenSSL cannot make any of them. */
static int fill_cert(X509 *cert, EVP_PKEY *pub, const char *cn, X509 *issuer, long not_before_s,
                     long not_after_s, char *err) {
    if (random_serial(cert) != 0) return err_set(err, "cannot draw a certificate serial");
    X509_NAME *name = X509_get_subject_name(cert);
    if (!X509_set_version(cert, 2) || !X509_gmtime_adj(X509_getm_notBefore(cert), not_before_s) ||
        !X509_gmtime_adj(X509_getm_notAfter(cert), not_after_s) || !X509_set_pubkey(cert, pub) ||
        !X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_UTF8, (const unsigned char *)cn, -1, -1,
                                    0) ||
        !X509_set_issuer_name(cert, issuer ? X509_get_subject_name(issuer) : name))
        return err_set(err, "cannot fill in the certificate for '%s' (out of memory)", cn);
    return 0;
}

/* Signs cert with key and checks the signature: OpenSSL 3.0's
 * ASN1_item_sign_ctx returns the signature's size even when the signing
 * itself failed for memory, leaving an empty signature behind. */
static int signed_ok(X509 *cert, EVP_PKEY *key) {
    return X509_sign(cert, key, EVP_sha256()) > 0 && X509_verify(cert, key) == 1;
}

int security_cert_create(const SecurityCertSpec *spec, const char *ca_cert_pem,
                         const char *ca_key_pem, char **out_cert_pem, char **out_key_pem,
                         char *err) {
    EVP_PKEY *key = EVP_EC_gen("P-256"), *ca_key = NULL;
    X509 *cert = X509_new(), *ca = NULL;
    int rc = -1;
    *out_cert_pem = *out_key_pem = NULL;
    if (key == NULL || cert == NULL) {
        err_set(err, "cannot generate an EC P-256 key");
        goto out;
    }
    if (ca_cert_pem) {
        ca = cert_parse(ca_cert_pem);
        ca_key = key_parse(ca_key_pem);
        if (ca == NULL || ca_key == NULL) {
            err_set(err, "cannot read the CA certificate or key");
            goto out;
        }
    }
    if (fill_cert(cert, key, spec->common_name, ca, spec->not_before_offset_s - 300,
                  spec->not_after_offset_s, err) != 0)
        goto out;
    X509 *issuer = ca ? ca : cert;
    int bad = 0;
    if (spec->is_ca) {
        bad |= add_ext(cert, issuer, NID_basic_constraints, "critical,CA:TRUE,pathlen:0");
        bad |= add_ext(cert, issuer, NID_key_usage, "critical,keyCertSign,cRLSign");
    } else {
        bad |= add_ext(cert, issuer, NID_basic_constraints, "critical,CA:FALSE");
        bad |= add_ext(cert, issuer, NID_key_usage, "critical,digitalSignature");
        bad |= add_ext(cert, issuer, NID_ext_key_usage, spec->server ? "serverAuth" : "clientAuth");
    }
    bad |= add_ext(cert, issuer, NID_subject_key_identifier, "hash");
    if (spec->sans && spec->sans[0]) bad |= add_ext(cert, issuer, NID_subject_alt_name, spec->sans);
    if (bad) {
        err_set(err, "cannot add certificate extensions (SANs '%s')", spec->sans ? spec->sans : "");
        goto out;
    }
    if (!signed_ok(cert, ca ? ca_key : key)) {
        err_set(err, "cannot sign the certificate");
        goto out;
    }
    *out_cert_pem = cert_pem(cert);
    *out_key_pem = key_pem(key);
    if (*out_cert_pem == NULL || *out_key_pem == NULL) {
        free(*out_cert_pem), free(*out_key_pem);
        *out_cert_pem = *out_key_pem = NULL;
        err_set(err, "cannot write PEM");
        goto out;
    }
    rc = 0;
out:
    EVP_PKEY_free(key);
    EVP_PKEY_free(ca_key);
    X509_free(cert);
    X509_free(ca);
    return rc;
}

int security_cert_identity(const char *pem, SecurityIdentity *id, char *err) {
    memset(id, 0, sizeof *id);
    X509 *c = cert_parse(pem);
    if (c == NULL) return err_set(err, "not a PEM certificate");
    /* a certificate without a CN has an empty name, which no site has */
    X509_NAME_get_text_by_NID(X509_get_subject_name(c), NID_commonName, id->name, sizeof id->name);
    BIGNUM *bn = ASN1_INTEGER_to_BN(X509_get0_serialNumber(c), NULL);
    char *hex = bn ? BN_bn2hex(bn) : NULL;
    unsigned char md[SHA256_LEN];
    unsigned int n = 0;
    struct tm tm;
    int rc = 0;
    /* every field or none: an identity without its serial or its expiry
     * would slip past the revocation and expiry checks */
    if (hex == NULL)
        rc = err_set(err, "cannot read the certificate's serial (out of memory)");
    else if (!X509_digest(c, EVP_sha256(), md, &n) || n != SHA256_LEN)
        rc = err_set(err, "cannot fingerprint the certificate");
    else if (!ASN1_TIME_to_tm(X509_get0_notAfter(c), &tm))
        rc = err_set(err, "cannot read the certificate's expiry");
    if (rc == 0) {
        snprintf(id->serial_hex, sizeof id->serial_hex, "%s", hex);
        security_hex(md, SHA256_LEN, id->sha256_hex);
        id->not_after = (int64_t)timegm(&tm) * 1000;
    } else {
        memset(id, 0, sizeof *id);
    }
    OPENSSL_free(hex);
    BN_free(bn);
    X509_free(c);
    return rc;
}

/* ---- CSRs, tokens, fingerprints ------------------------------------------------ */

int security_csr_create(const char *name, char **out_csr_pem, char **out_key_pem, char *err) {
    *out_csr_pem = *out_key_pem = NULL;
    EVP_PKEY *key = EVP_EC_gen("P-256");
    X509_REQ *req = X509_REQ_new();
    int rc = -1;
    if (key == NULL || req == NULL) {
        err_set(err, "cannot generate an EC P-256 key");
        goto out;
    }
    if (!X509_REQ_set_version(req, 0) ||
        !X509_NAME_add_entry_by_txt(X509_REQ_get_subject_name(req), "CN", MBSTRING_UTF8,
                                    (const unsigned char *)name, -1, -1, 0) ||
        !X509_REQ_set_pubkey(req, key)) {
        err_set(err, "cannot fill in the certificate request (out of memory)");
        goto out;
    }
    /* checked as signed_ok checks a certificate */
    if (X509_REQ_sign(req, key, EVP_sha256()) <= 0 || X509_REQ_verify(req, key) != 1) {
        err_set(err, "cannot sign the certificate request");
        goto out;
    }
    BIO *b = BIO_new(BIO_s_mem());
    if (b && PEM_write_bio_X509_REQ(b, req)) *out_csr_pem = bio_string(b);
    BIO_free(b);
    *out_key_pem = key_pem(key);
    if (*out_csr_pem == NULL || *out_key_pem == NULL) {
        free(*out_csr_pem), free(*out_key_pem);
        *out_csr_pem = *out_key_pem = NULL;
        err_set(err, "cannot write PEM");
        goto out;
    }
    rc = 0;
out:
    EVP_PKEY_free(key);
    X509_REQ_free(req);
    return rc;
}

int security_csr_sign(const char *ca_cert_pem, const char *ca_key_pem, const uint8_t *csr,
                      size_t csr_len, const char *site_name, long days, char **out_cert_pem,
                      char *err) {
    *out_cert_pem = NULL;
    if (csr_len == 0 || csr_len > 16384)
        return err_set(err, "certificate request of %zu bytes; expected a PEM CSR under 16 KiB",
                       csr_len);
    BIO *b = BIO_new_mem_buf(csr, (int)csr_len);
    X509_REQ *req = b ? PEM_read_bio_X509_REQ(b, NULL, NULL, NULL) : NULL;
    BIO_free(b);
    ERR_clear_error();
    if (req == NULL) return err_set(err, "certificate request is not a PEM CSR");
    int rc = -1;
    X509 *ca = NULL, *cert = NULL;
    EVP_PKEY *ca_key = NULL, *pub = X509_REQ_get_pubkey(req);
    STACK_OF(X509_EXTENSION) *exts = X509_REQ_get_extensions(req);
    char group[32] = "";
    size_t glen = 0;
    if (pub == NULL || EVP_PKEY_get_base_id(pub) != EVP_PKEY_EC ||
        !EVP_PKEY_get_utf8_string_param(pub, "group", group, sizeof group, &glen) ||
        strcmp(group, "prime256v1") != 0) {
        err_set(err, "certificate request key must be EC P-256");
        goto out;
    }
    if (X509_REQ_verify(req, pub) != 1) {
        err_set(err, "certificate request signature does not verify");
        goto out;
    }
    /* the issued certificate carries only what the coordinator decides; a
     * request asking for anything (CA:TRUE, SANs, usages) is refused */
    if (exts != NULL && sk_X509_EXTENSION_num(exts) > 0) {
        err_set(err, "certificate request asks for extensions; send a plain CSR (strait site "
                     "join makes one)");
        goto out;
    }
    ca = cert_parse(ca_cert_pem);
    ca_key = key_parse(ca_key_pem);
    cert = X509_new();
    if (ca == NULL || ca_key == NULL || cert == NULL) {
        err_set(err, "cannot load the federation CA");
        goto out;
    }
    if (fill_cert(cert, pub, site_name, ca, -300, days * 86400L, err) != 0) goto out;
    char san[96];
    snprintf(san, sizeof san, "DNS:%s", site_name);
    if (add_ext(cert, ca, NID_basic_constraints, "critical,CA:FALSE") ||
        add_ext(cert, ca, NID_key_usage, "critical,digitalSignature") ||
        add_ext(cert, ca, NID_ext_key_usage, "clientAuth") ||
        add_ext(cert, ca, NID_subject_key_identifier, "hash") ||
        add_ext(cert, ca, NID_authority_key_identifier, "keyid") ||
        add_ext(cert, ca, NID_subject_alt_name, san)) {
        err_set(err, "cannot build the certificate for '%s'", site_name);
        goto out;
    }
    if (!signed_ok(cert, ca_key)) {
        err_set(err, "cannot sign the certificate");
        goto out;
    }
    *out_cert_pem = cert_pem(cert);
    rc = *out_cert_pem ? 0 : err_set(err, "cannot write PEM");
out:
    sk_X509_EXTENSION_pop_free(exts, X509_EXTENSION_free);
    EVP_PKEY_free(pub);
    EVP_PKEY_free(ca_key);
    X509_free(ca);
    X509_free(cert);
    X509_REQ_free(req);
    ERR_clear_error();
    return rc;
}

int security_random_token(char hex[SECURITY_TOKEN_HEX], char *err) {
    uint8_t bytes[32];
    if (RAND_bytes(bytes, sizeof bytes) != 1) return err_set(err, "the OS gave no random bytes");
    security_hex(bytes, sizeof bytes, hex);
    return 0;
}

int security_ct_equal(const void *a, const void *b, size_t len) {
    return CRYPTO_memcmp(a, b, len) == 0;
}
