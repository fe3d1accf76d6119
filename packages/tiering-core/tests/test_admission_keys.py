"""The factory's policy keys are the admission policy's: the kernel names them, the feature declares them."""

from tiering.core.factory import ENTRY_POLICIES, POLICY_KEYS, entry_policies
from tiering.core.policies.admission import ADMISSION_KEY_NAMES


def test_the_factory_hands_over_exactly_the_keys_the_policy_declares():
    assert POLICY_KEYS == ADMISSION_KEY_NAMES
    assert entry_policies().__name__ == ENTRY_POLICIES
    assert callable(entry_policies().split_entry) and callable(entry_policies().refuse_admission)


def test_an_entry_without_policy_keys_never_loads_the_policy():
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from tiering.core.factory import resolve_tier\n"
        "resolve_tier({'type': 'DictLike', 'module_path': 'collections'}) if False else None\n"
        "from tiering.core.spec import OffloadingSpec\n"
        "print('tiering.core.policies.admission' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == "False"
