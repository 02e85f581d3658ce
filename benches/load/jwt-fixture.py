#!/usr/bin/env python3
"""JWT fixtures for the load benchmark, with the standard library and the openssl command only.

  jwt-fixture.py keys DIR                 makes DIR/rsa.pem (2048-bit), DIR/ec.pem (P-256) and
                                          DIR/jwks.json holding both public keys (kids rsa, ec)
  jwt-fixture.py token DIR ALG WORKSPACE  prints a token signed with DIR's key for ALG (RS256 or
                                          ES256): sub, exp (an hour), iss, aud, scope, workspace_id
"""
import base64
import json
import os
import re
import subprocess
import sys
import time

ISSUER = "https://idp.bench/"
AUDIENCE = "gateway-bench"


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def openssl(*args: str, data: bytes = b"") -> bytes:
    return subprocess.run(["openssl", *args], input=data, check=True, capture_output=True).stdout


def int_bytes(hex_text: str) -> bytes:
    return bytes.fromhex(hex_text if len(hex_text) % 2 == 0 else "0" + hex_text)


def keys(directory: str) -> None:
    os.makedirs(directory, exist_ok=True)
    rsa, ec = os.path.join(directory, "rsa.pem"), os.path.join(directory, "ec.pem")
    openssl("genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048", "-out", rsa)
    openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", ec)
    modulus = openssl("rsa", "-in", rsa, "-noout", "-modulus").decode().strip().split("=", 1)[1]
    text = openssl("pkey", "-in", ec, "-noout", "-text").decode()
    point = "".join(re.search(r"pub:\s*((?:[0-9a-f]{2}:?\s*)+)", text).group(1).split()).replace(":", "")
    point = bytes.fromhex(point)  # 04 || x || y
    jwks = {"keys": [
        {"kty": "RSA", "kid": "rsa", "alg": "RS256", "use": "sig",
         "n": b64url(int_bytes(modulus)), "e": b64url((65537).to_bytes(3, "big"))},
        {"kty": "EC", "kid": "ec", "alg": "ES256", "use": "sig", "crv": "P-256",
         "x": b64url(point[1:33]), "y": b64url(point[33:65])},
    ]}
    with open(os.path.join(directory, "jwks.json"), "w") as f:
        json.dump(jwks, f)


def der_to_raw(der: bytes) -> bytes:
    """An ECDSA signature from DER (SEQUENCE of two INTEGERs) to JWS's r || s, 32 bytes each."""
    assert der[0] == 0x30
    at = 2 if der[1] < 0x80 else 3
    out = b""
    for _ in range(2):
        assert der[at] == 0x02
        length = der[at + 1]
        value = der[at + 2:at + 2 + length].lstrip(b"\0")
        out += value.rjust(32, b"\0")
        at += 2 + length
    return out


def token(directory: str, alg: str, workspace: str) -> str:
    kid, pem = {"RS256": ("rsa", "rsa.pem"), "ES256": ("ec", "ec.pem")}[alg]
    now = int(time.time())
    header = {"alg": alg, "typ": "JWT", "kid": kid}
    claims = {"sub": "bench-user", "iat": now, "exp": now + 3600, "iss": ISSUER, "aud": AUDIENCE,
              "scope": "completions.write", "workspace_id": workspace}
    signing_input = f"{b64url(json.dumps(header).encode())}.{b64url(json.dumps(claims).encode())}"
    signature = openssl("dgst", "-sha256", "-sign", os.path.join(directory, pem),
                        data=signing_input.encode())
    if alg == "ES256":
        signature = der_to_raw(signature)
    return f"{signing_input}.{b64url(signature)}"


if __name__ == "__main__":
    if sys.argv[1:2] == ["keys"] and len(sys.argv) == 3:
        keys(sys.argv[2])
    elif sys.argv[1:2] == ["token"] and len(sys.argv) == 5:
        print(token(sys.argv[2], sys.argv[3], sys.argv[4]))
    else:
        sys.exit(__doc__)
