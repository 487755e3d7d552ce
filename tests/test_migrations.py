"""Every model change has its migration (a help text included): otherwise a deploy's
``migrate`` leaves the schema behind the code."""

from __future__ import annotations

import pytest
from django.core.management import call_command


@pytest.mark.django_db
def test_the_models_and_the_migrations_agree() -> None:
    call_command("makemigrations", "--check", "--dry-run", verbosity=0)
