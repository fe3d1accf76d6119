"""The factory's policy keys are the admission policy's: the kernel names them, the feature declares them."""

from tiering.core.factory import ENTRY_POLICIES, POLICY_KEYS, entry_policies
from tiering.core.policies.admission import ADMISSION_KEY_NAMES


def test_the_factory_hands_over_exactly_the_keys_the_policy_declares():
    assert POLICY_KEYS == ADMISSION_KEY_NAMES
    assert entry_policies().__name__ == ENTRY_POLICIES
    assert callable(entry_policies().split_entry) and callable(entry_policies().refuse_admission)


def test_the_policy_is_loaded_only_for_an_entry_with_policy_keys(tmp_path):
    import os
    import subprocess
    import sys

    (tmp_path / "plain_tier.py").write_text(
        "from tiering.core.base import SecondaryTierManager\n"
        "class PlainTier(SecondaryTierManager):\n"
        "    def lookup(self, key, ctx): return False\n"
        "    def submit_store(self, job): pass\n"
        "    def submit_load(self, job): pass\n"
        "    def get_finished(self): return []\n"
    )
    code = (
        "import sys\n"
        "from tiering.core.factory import resolve_tier\n"
        "entry = {'type': 'PlainTier', 'module_path': 'plain_tier'}\n"
        "resolve_tier(entry)\n"
        "print('tiering.core.policies.admission' in sys.modules)\n"
        "resolve_tier({**entry, 'admission': 'second_sighting'})\n"
        "print('tiering.core.policies.admission' in sys.modules)\n"
    )
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert out.stdout.split() == ["False", "True"], out.stdout + out.stderr
