"""Unit tests for proxy.domain.module_sources: go-getter subdir splitting and classification of module sources."""

from __future__ import annotations

import pytest

from proxy.domain.module_sources import (
    GitSource,
    HttpArchive,
    Passthrough,
    Refused,
    classify,
    proxied_location,
    split_subdir,
)

# ---------------------------------------------------------------------------------------------
# split_subdir (go-getter SourceDirSubdir)
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("source", "package", "subdir"),
    [
        ("https://h/x.tar.gz//sub/dir", "https://h/x.tar.gz", "sub/dir"),
        ("https://h/x.tar.gz//sub", "https://h/x.tar.gz", "sub"),
        ("git::https://h/r.git//sub?ref=v1", "git::https://h/r.git?ref=v1", "sub"),
        ("https://h/r.git//a/b?ref=v1&depth=1", "https://h/r.git?ref=v1&depth=1", "a/b"),
        ("https://h/x.tar.gz", "https://h/x.tar.gz", ""),
        ("https://h/a/b/c.zip", "https://h/a/b/c.zip", ""),
        ("https://h/x.zip?archive=zip", "https://h/x.zip?archive=zip", ""),
        # a `//` after the `?` belongs to the query, not to a subdir
        ("https://h/x.zip?u=https://other/y", "https://h/x.zip?u=https://other/y", ""),
        ("https://h/x.zip?a=b//c", "https://h/x.zip?a=b//c", ""),
        ("https://h/x.zip//sub?u=https://other//y", "https://h/x.zip?u=https://other//y", "sub"),
        # without a scheme the search starts at the beginning
        ("github.com/owner/repo//sub", "github.com/owner/repo", "sub"),
        ("github.com/owner/repo", "github.com/owner/repo", ""),
        ("git@github.com:owner/repo.git//modules/x", "git@github.com:owner/repo.git", "modules/x"),
        # the scheme's own `//` is never a subdir
        ("s3::https://s3.amazonaws.com/bucket/x.zip", "s3::https://s3.amazonaws.com/bucket/x.zip", ""),
        # only the first `//` after the scheme splits; the rest stays in the subdir
        ("https://h/x.zip//a//b", "https://h/x.zip", "a//b"),
        ("https://h/x.zip///etc", "https://h/x.zip", "/etc"),
        # an empty subdir
        ("https://h/x.zip//", "https://h/x.zip", ""),
        ("", "", ""),
    ],
)
def test_split_subdir(source: str, package: str, subdir: str) -> None:
    assert split_subdir(source) == (package, subdir)


# ---------------------------------------------------------------------------------------------
# classify: https archives
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("location", "expected"),
    [
        ("https://h.example/m/x.zip", HttpArchive("https://h.example/m/x.zip", "zip")),
        ("https://h.example/m/x.tar.gz", HttpArchive("https://h.example/m/x.tar.gz", "tar.gz")),
        ("https://h.example/m/x.tgz", HttpArchive("https://h.example/m/x.tgz", "tar.gz")),
        ("https://h.example/m/x.tar.bz2", HttpArchive("https://h.example/m/x.tar.bz2", "tar.bz2")),
        ("https://h.example/m/x.tbz2", HttpArchive("https://h.example/m/x.tbz2", "tar.bz2")),
        ("https://h.example/m/x.tar.xz", HttpArchive("https://h.example/m/x.tar.xz", "tar.xz")),
        ("https://h.example/m/x.txz", HttpArchive("https://h.example/m/x.txz", "tar.xz")),
        ("https://h.example/m/x.tar", HttpArchive("https://h.example/m/x.tar", "tar")),
        ("https://h.example/m/X.ZIP", HttpArchive("https://h.example/m/X.ZIP", "zip")),
        ("https://h.example/m/x.Tar.Gz", HttpArchive("https://h.example/m/x.Tar.Gz", "tar.gz")),
        # the extension is read from the path, a query does not hide it and is kept
        ("https://h.example/m/x.zip?token=abc", HttpArchive("https://h.example/m/x.zip?token=abc", "zip")),
        # `https::` forced getter is the same as plain https
        ("https::https://h.example/m/x.zip", HttpArchive("https://h.example/m/x.zip", "zip")),
        # `?archive=` on an extension-less URL: the parameter is removed, the others kept
        ("https://h.example/download?archive=zip", HttpArchive("https://h.example/download", "zip")),
        ("https://h.example/download?archive=tar.gz", HttpArchive("https://h.example/download", "tar.gz")),
        ("https://h.example/download?archive=tgz", HttpArchive("https://h.example/download", "tar.gz")),
        ("https://h.example/download?archive=ZIP", HttpArchive("https://h.example/download", "zip")),
        (
            "https://h.example/download?archive=zip&token=abc",
            HttpArchive("https://h.example/download?token=abc", "zip"),
        ),
        (
            "https://h.example/download?a=1&archive=tar.xz&b=2",
            HttpArchive("https://h.example/download?a=1&b=2", "tar.xz"),
        ),
        # `?archive=` overrides the extension
        ("https://h.example/x.zip?archive=tar.gz", HttpArchive("https://h.example/x.zip", "tar.gz")),
        # a subdir is kept for the client, and the query moves back onto the package URL
        ("https://h.example/m/x.zip//modules/vpc", HttpArchive("https://h.example/m/x.zip", "zip", "modules/vpc")),
        ("https://h.example/m/x.tgz//sub?token=t", HttpArchive("https://h.example/m/x.tgz?token=t", "tar.gz", "sub")),
        ("https://h.example/download//sub?archive=zip", HttpArchive("https://h.example/download", "zip", "sub")),
        # a fragment is not part of what is fetched
        ("https://h.example/m/x.zip#frag", HttpArchive("https://h.example/m/x.zip", "zip")),
    ],
)
def test_classify_https_archives(location: str, expected: HttpArchive) -> None:
    assert classify(location) == expected


# ---------------------------------------------------------------------------------------------
# classify: git
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("location", "expected"),
    [
        ("git::https://host.example/repo.git?ref=v1.2.0", GitSource("https://host.example/repo.git", "v1.2.0")),
        ("git::https://host.example/repo.git", GitSource("https://host.example/repo.git", "")),
        ("GIT::https://host.example/repo.git?ref=main", GitSource("https://host.example/repo.git", "main")),
        ("git::https://host.example/repo.git?ref=0123abcd", GitSource("https://host.example/repo.git", "0123abcd")),
        (
            "git::https://host.example/repo.git?ref=release/1.x",
            GitSource("https://host.example/repo.git", "release/1.x"),
        ),
        # other query parameters are not part of the clone URL
        ("git::https://host.example/repo.git?ref=v1&depth=1", GitSource("https://host.example/repo.git", "v1")),
        ("git::https://host.example/repo.git//sub?ref=x", GitSource("https://host.example/repo.git", "x", "sub")),
        ("git::https://host.example/repo.git//a/b/c?ref=x", GitSource("https://host.example/repo.git", "x", "a/b/c")),
        ("git::https://host.example/repo.git//sub", GitSource("https://host.example/repo.git", "", "sub")),
        # the GitHub shorthand
        ("github.com/owner/repo", GitSource("https://github.com/owner/repo.git", "")),
        ("github.com/owner/repo?ref=v1", GitSource("https://github.com/owner/repo.git", "v1")),
        ("github.com/owner/repo.git?ref=v1", GitSource("https://github.com/owner/repo.git", "v1")),
        ("github.com/owner/repo//sub", GitSource("https://github.com/owner/repo.git", "", "sub")),
        ("github.com/owner/repo/sub", GitSource("https://github.com/owner/repo.git", "", "sub")),
        ("github.com/owner/repo/a/b?ref=v2", GitSource("https://github.com/owner/repo.git", "v2", "a/b")),
        ("github.com/owner/repo//sub?ref=v2", GitSource("https://github.com/owner/repo.git", "v2", "sub")),
    ],
)
def test_classify_git(location: str, expected: GitSource) -> None:
    result = classify(location)
    assert result == expected
    assert result.archive == "tar.gz"


# ---------------------------------------------------------------------------------------------
# classify: passthrough
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("location", "kind"),
    [
        ("s3::https://s3-eu-west-1.amazonaws.com/bucket/vpc.zip", "s3"),
        ("gcs::https://www.googleapis.com/storage/v1/bucket/vpc.zip", "gcs"),
        ("hg::https://hg.example/repo", "hg"),
        ("oci::registry.example/module", "oci"),
        ("git@github.com:owner/repo.git", "git-ssh"),
        ("git@github.com:owner/repo.git//sub", "git-ssh"),
        ("git::ssh://git@host.example/repo.git", "git-ssh"),
        ("git::git@host.example:owner/repo.git", "git-ssh"),
        ("ssh://git@host.example/repo.git", "git-ssh"),
        ("bitbucket.org/owner/repo", "detector"),
        ("https://h.example/some/page", "http"),
        ("https://h.example/module?version=1", "http"),
        ("https://h.example/x.zip.sig", "http"),
        ("https://h.example/download?archive=false", "http"),
        ("svn::https://svn.example/repo", "svn"),
    ],
)
def test_classify_passthrough(location: str, kind: str) -> None:
    assert classify(location) == Passthrough(location, kind)


# ---------------------------------------------------------------------------------------------
# classify: refused
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "location",
    [
        "file:///etc/passwd",
        "file://localhost/etc/passwd",
        "file::/x",
        "file::./x",
        "/abs/path",
        "./rel",
        "../rel",
        "C:\\x",
        "c:\\modules\\vpc",
        "\\\\server\\share\\module",
        "http://host.example/x.zip",
        "HTTP://host.example/x.zip",
        "http://host.example/download?archive=zip",
        "git::http://host.example/r.git",
        "git::file:///srv/repo.git",
        "git::/srv/repo.git",
        "https://user:pw@host.example/x.zip",
        "https://user@host.example/x.zip",
        "git::https://u:p@host.example/r.git",
        "git::https://token@host.example/r.git?ref=v1",
        # the subdirectory escapes the package
        "https://h.example/x.zip//../../etc",
        "https://h.example/x.zip//..",
        "https://h.example/x.zip//a/../../etc",
        "https://h.example/x.zip///etc",
        "git::https://host.example/r.git//../x?ref=v1",
        "git::https://host.example/r.git///etc?ref=v1",
        "github.com/owner/repo//../x",
        "s3::https://s3.amazonaws.com/bucket/x.zip//../../x",
        # the GitHub shorthand's extra path segments are a subdir too
        "github.com/owner/repo/../../etc",
        "github.com/owner/repo/a/../../x",
        # git refs that would be options or are otherwise malformed
        "git::https://host.example/r.git?ref=--upload-pack=x",
        "git::https://host.example/r.git?ref=-x",
        "git::https://host.example/r.git?ref=v1%20x",
        "git::https://host.example/r.git?ref=a+b",
        "git::https://host.example/r.git?ref=v1%0a",
        "git::https://host.example/r.git?ref=v1%09",
        "git::https://host.example/r.git?ref=a..b",
        "github.com/owner/repo?ref=--upload-pack=touch",
        # an incomplete GitHub shorthand
        "github.com/owner",
        "github.com/owner/",
    ],
)
def test_classify_refused(location: str) -> None:
    result = classify(location)
    assert isinstance(result, Refused), result
    assert result.location == location
    assert result.reason


# ---------------------------------------------------------------------------------------------
# proxied_location
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "source", "expected"),
    [
        (
            "/registry/h/modules/v1/a/b/c/1.0.0/archive.zip",
            HttpArchive("https://h/x.zip", "zip"),
            "/registry/h/modules/v1/a/b/c/1.0.0/archive.zip",
        ),
        (
            "/registry/h/modules/v1/a/b/c/1.0.0/archive.zip",
            HttpArchive("https://h/x.zip", "zip", "modules/vpc"),
            "/registry/h/modules/v1/a/b/c/1.0.0/archive.zip//modules/vpc",
        ),
        ("/p/archive.tar.gz", GitSource("https://h/r.git", "v1"), "/p/archive.tar.gz"),
        ("/p/archive.tar.gz", GitSource("https://h/r.git", "v1", "sub"), "/p/archive.tar.gz//sub"),
    ],
)
def test_proxied_location(path: str, source: HttpArchive | GitSource, expected: str) -> None:
    assert proxied_location(path, source) == expected


def test_proxied_location_round_trips_through_split_subdir() -> None:
    source = classify("https://h.example/x.zip//a/b")
    assert isinstance(source, HttpArchive)
    assert split_subdir(proxied_location("/registry/x/archive.zip", source)) == ("/registry/x/archive.zip", "a/b")


@pytest.mark.parametrize(
    "query, expected",
    [
        ("checksum=sha256:" + "ab" * 32, ("sha256", "ab" * 32)),
        ("checksum=" + "CD" * 20, ("sha1", "cd" * 20)),
        ("checksum=md5:" + "0" * 32, ("md5", "0" * 32)),
    ],
)
def test_checksum_is_parsed_and_removed_from_the_url(query, expected):
    source = classify(f"https://h.example/m.tar.gz?x=1&{query}")
    assert isinstance(source, HttpArchive)
    assert source.checksum == expected
    assert source.url == "https://h.example/m.tar.gz?x=1"


def test_checksum_file_form_is_passed_through():
    source = classify("https://h.example/m.tar.gz?checksum=file:https://h.example/SUMS")
    assert isinstance(source, Passthrough) and source.kind == "checksum-file"


def test_malformed_checksum_is_passed_through_not_silently_dropped():
    assert isinstance(classify("https://h.example/m.tar.gz?checksum=sha256:xyz"), Passthrough)
