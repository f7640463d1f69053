import pytest

# torch_cases.py holds tests that test_torch_cpu.py and test_torch_cuda.py
# import: let pytest rewrite its asserts as it does a test module's.
pytest.register_assert_rewrite("torch_cases")
