import pytest

from tests.book.pages import HTML


@pytest.fixture(scope="session")
def built_book():
    if not (HTML / "index.html").exists():
        pytest.fail(
            "the book is not built: run `make book` (or `make test`, which builds it) first"
        )
    return HTML
