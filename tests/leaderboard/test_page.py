"""index.html: no entry text or banner can add markup to it; in a real browser, its tables, sorting by
mouse and keyboard, the filters, a page that fits the screen, and a level an entry lacks drawn as a gap."""
from __future__ import annotations

import json
import os
import re
import shutil

import pytest

from tests.leaderboard.helpers import tiny_run
from tmem_bench.cli import main
from tmem_bench.leaderboard.page import render_page


def test_entry_text_and_a_banner_add_no_markup():
    hostile = "</script><script>alert(1)</script><!-- it's \"quoted\" & <b>bold</b>"
    group = {"profile": "p", "task": "coordinate_binding", "variant": "standard", "kind": "standard",
             "kind_title": hostile, "about": hostile, "levels": ["-"], "labels": {"-": "-"}, "chance": {"-": 0.1},
             "ceiling": {"-": 1.0}, "rows": [{"slug": "s", "name": hostile, "description": hostile, "model": "base",
                                             "label": "base", "cells": {}}]}
    page = render_page(json.dumps([group]), banner=hostile)
    assert page.count("<script") == 2 and page.count("</script>") == 2 and "<b>" not in page and "<!--" not in page
    data = json.loads(page.split('id="board-data">')[1].split("</script>")[0])
    assert data[0]["rows"][0]["name"] == data[0]["about"] == hostile
    assert '<p class="banner" role="note">&lt;/script&gt;&lt;script&gt;alert(1)' in page


def test_a_phone_sees_the_ranking_and_a_table_first():
    """At 400 px the column a table is ranked by was the 7th of 12, off-screen, and the first table began
    1,150 px down: the score and the mean beside it follow the rank, the table comes before its figure,
    and how to read the board is folded."""
    page = render_page(json.dumps([]))
    columns = page.split("function columns(group)")[1].split("function ")[0]
    keys = re.findall(r"\{key: '(\w+)'", columns)
    assert keys[:3] == ["rank", "score", "mean"] and keys.index("name") == 3, keys
    assert page.index("sec.appendChild(table(group))") < page.index("sec.appendChild(figure(group))")
    assert '<details class="note"><summary>How to read this board</summary>' in page
    assert "r.unranked" in columns  # the reason a row takes no rank, not only its seeds


def chromium():
    from shutil import which

    browser = which("chromium") or which("chromium-browser")
    driver = which("chromedriver")
    try:
        import selenium  # noqa: F401
    except ImportError:
        return None
    return (browser, driver) if browser and driver else None


def test_board_page_in_a_real_browser(pristine, tmp_path):
    found = chromium()
    if found is None:
        if os.environ.get("CI"):
            pytest.fail("CI is set but Chromium, chromedriver or selenium is missing (apt-get install -y chromium "
                        "chromium-driver; pip install selenium)")
        pytest.skip("needs Chromium: apt-get install -y chromium chromium-driver, and pip install selenium")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import Select

    board = tmp_path / "lb"
    shutil.copytree(pristine, board)
    source = tmp_path / "src"
    source.mkdir()
    # A second profile (one seed, unranked) so that the profile filter has something to hide.
    run_dir = tiny_run(source, "no_harm", "--models", "lstm", "--seeds", "1", "--steps", "1")
    assert main(["leaderboard", "submit", str(run_dir), "--name", "Other profile", "--leaderboard", str(board)]) == 0
    assert main(["leaderboard", "build", "--leaderboard", str(board)]) == 0

    options = webdriver.ChromeOptions()
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        options.add_argument(flag)
    options.binary_location = found[0]
    driver = webdriver.Chrome(service=Service(found[1]), options=options)
    try:
        driver.get((board / "index.html").as_uri())
        sections = driver.find_elements(By.CSS_SELECTOR, "section.group")
        assert len(sections) == 3  # tiny profile: two tasks; the other profile: no_harm
        shown = {(s.get_attribute("data-task"), tuple(r.get_attribute("data-slug") for r in
                  s.find_elements(By.CSS_SELECTOR, "tbody tr"))) for s in sections}
        assert ("coordinate_binding", ("tiny-base", "tiny-lstm")) in {(t, tuple(sorted(r))) for t, r in shown}
        assert ("no_harm", ("other-profile",)) in shown
        assert all(s.find_element(By.TAG_NAME, "svg").find_elements(By.TAG_NAME, "path") for s in sections)

        binding = next(s for s in sections if s.get_attribute("data-task") == "coordinate_binding")
        table = binding.find_element(By.TAG_NAME, "table")

        def slugs():
            return [r.get_attribute("data-slug") for r in table.find_elements(By.CSS_SELECTOR, "tbody tr")]

        def names():
            column = 1 + [th.get_attribute("data-key") for th in table.find_elements(By.TAG_NAME, "th")].index("name")
            return [td.text for td in table.find_elements(By.CSS_SELECTOR, f"tbody tr td:nth-child({column})")]

        ranked = slugs()  # best score first
        table.find_element(By.CSS_SELECTOR, "th[data-key=score]").click()
        assert slugs() == list(reversed(ranked)) and len(ranked) == 2
        header = table.find_element(By.CSS_SELECTOR, "th[data-key=name]")
        header.click()
        assert names() == sorted(names(), key=str.lower)
        header.click()
        assert names() == sorted(names(), key=str.lower, reverse=True)

        # Keyboard: the score header is reached with Tab from the top of the page and sorts with Enter and Space.
        driver.refresh()
        sections = driver.find_elements(By.CSS_SELECTOR, "section.group")
        binding = next(s for s in sections if s.get_attribute("data-task") == "coordinate_binding")
        table = binding.find_element(By.TAG_NAME, "table")
        score = table.find_element(By.CSS_SELECTOR, "th[data-key=score]")
        assert slugs() == ranked and score.get_attribute("aria-sort") == "none"
        assert table.find_element(By.CSS_SELECTOR, "th[data-key=rank]").get_attribute("aria-sort") == "ascending"
        target = score.find_element(By.TAG_NAME, "button")
        for _ in range(60):
            ActionChains(driver).send_keys(Keys.TAB).perform()
            if driver.switch_to.active_element == target:
                break
        assert driver.switch_to.active_element == target, "the score header cannot be reached with Tab"
        ActionChains(driver).send_keys(Keys.ENTER).perform()
        assert slugs() == list(reversed(ranked)) and score.get_attribute("aria-sort") == "ascending"
        ActionChains(driver).send_keys(Keys.SPACE).perform()
        assert slugs() == ranked and score.get_attribute("aria-sort") == "descending"
        assert table.find_element(By.CSS_SELECTOR, "th[data-key=rank]").get_attribute("aria-sort") == "none"
        # The one-seed entry is unranked with its reason (a step of training leaves it at chance, said first).
        body = driver.find_element(By.TAG_NAME, "body").text
        assert "unranked (1 seed)" in body or "unranked (at chance)" in body

        Select(driver.find_element(By.ID, "filter-task")).select_by_value("no_harm")
        visible = [s for s in sections if s.is_displayed()]
        assert {s.get_attribute("data-task") for s in visible} == {"no_harm"} and len(visible) == 2
        # A table's profile id is what plans its own task (board.py), so the tiny profile's no_harm table
        # has an id of its own, beside the other profile's.
        profile = next(s.get_attribute("data-profile") for s in visible
                       if "other-profile" not in [r.get_attribute("data-slug")
                                                  for r in s.find_elements(By.CSS_SELECTOR, "tbody tr")])
        Select(driver.find_element(By.ID, "filter-profile")).select_by_value(profile)
        visible = [s for s in sections if s.is_displayed()]
        shown = [(s.get_attribute("data-profile"), s.get_attribute("data-task")) for s in visible]
        assert shown == [(profile, "no_harm")]

        # The page fits the screen: the document never scrolls sideways (a phone's 400 px, with the
        # viewport meta read as a phone reads it, and two desktop widths); a table wider than the
        # screen scrolls inside its own box.
        widths = {}
        for width, mobile in ((400, True), (1024, False), (1400, False)):
            driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                                   {"width": width, "height": 900, "deviceScaleFactor": 1, "mobile": mobile})
            driver.refresh()
            document, boxes, figures = driver.execute_script(
                "const d = document.documentElement;"
                "return [d.scrollWidth, Array.from(document.querySelectorAll('.scroll'), b => [b.clientWidth, "
                "b.scrollWidth]), Array.from(document.querySelectorAll('svg.figure'), f => "
                "f.getBoundingClientRect().right)];")
            widths[width] = document
            assert document <= width, f"at {width} px the document is {document} px wide"
            assert all(inner <= width for inner, _ in boxes) and all(right <= width for right in figures)
            if width == 400:
                assert any(outer > inner for inner, outer in boxes)  # the wide table scrolls in its box
                # Scrolled to its far right, a table still shows its ranks (they were scrolled off-screen).
                shown = driver.execute_script(
                    "return Array.from(document.querySelectorAll('.scroll'), b => { b.scrollLeft = b.scrollWidth;"
                    " const box = b.getBoundingClientRect(); return Array.from(b.querySelectorAll("
                    "'tr > :first-child'), c => { const r = c.getBoundingClientRect();"
                    " return r.left >= box.left - 1 && r.right <= box.right + 1 && r.right <= 400; }); }).flat();")
                assert shown and all(shown), shown
                # The first screen holds a table with the column it is ranked by.
                top, right = driver.execute_script(
                    "const s = document.querySelector('.scroll'); s.scrollLeft = 0; const t = s.getBoundingClientRect();"
                    " return [t.top, s.querySelector('th[data-key=score]').getBoundingClientRect().right];")
                assert top < 900 and right <= 400, (top, right)
        print("document widths:", widths)
        driver.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})

        # A level an entry lacks is a gap in its line, not a straight line across it.
        page = (board / "index.html").read_text()
        data = json.loads(page.split('id="board-data">')[1].split("</script>")[0])
        group = next(g for g in data if g["task"] == "coordinate_binding")
        first, last = group["levels"]
        group["levels"] = [first, "gap", last]
        group["labels"]["gap"], group["chance"]["gap"], group["ceiling"]["gap"] = "gap", 0.5, 1.0
        holes, whole = group["rows"]
        whole["cells"]["gap"] = whole["cells"][first]
        gap = tmp_path / "gap.html"
        gap.write_text(render_page(json.dumps(data)))
        driver.get(gap.as_uri())
        path = {slug: driver.find_element(By.CSS_SELECTOR, f"section[data-task=coordinate_binding] "
                                                           f"g[data-slug='{slug}'] path").get_attribute("d")
                for slug in (holes["slug"], whole["slug"])}
        assert path[holes["slug"]].count("M") == 2 and "L" not in path[holes["slug"]], path
        assert path[whole["slug"]].count("M") == 1 and path[whole["slug"]].count("L") == 2, path

        # A line lying on one drawn before it is dashed, with hollow points, and the legend says so.
        holes["cells"] = dict(whole["cells"])
        same = tmp_path / "same.html"
        same.write_text(render_page(json.dumps(data)))
        driver.get(same.as_uri())
        section = driver.find_element(By.CSS_SELECTOR, "section[data-task=coordinate_binding]")
        first_drawn, second_drawn = (section.find_element(By.CSS_SELECTOR, f"g[data-slug='{row['slug']}'] path")
                                     for row in group["rows"])
        assert first_drawn.get_attribute("stroke-dasharray") is None
        assert second_drawn.get_attribute("stroke-dasharray") == "5 3"
        assert "a line lying on another" in section.find_element(By.CSS_SELECTOR, "ul.legend").text
    finally:
        driver.quit()
